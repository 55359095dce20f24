"""`lantern serve`: the OpenAI-compatible API over real HTTP (uvicorn), driven by the unmodified
`openai` client and by raw requests for the error paths. The API tests run on both engines: `tvm`
(the artifact's CPU library) and `llamacpp` (its GGUF on llama.cpp)."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from browser import lantern_server, wait_until_ready
from test_runtime import cpu_greedy, user
from test_smollm2 import PROMPTS, eos_id

from lantern.runtime.artifact import Artifact
from lantern.chat_template import render
from lantern.server.app import Limits, ServerConfig
from lantern.server.protocol import ChatCompletion, ChatCompletionChunk
from lantern.server.sampler import Rng, Sampler, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_q4) -> Artifact:
    return smollm2_q4


ENGINES = ["tvm", "llamacpp"]


@contextlib.contextmanager
def served(art: Artifact, **config):
    cfg = ServerConfig([art.path], **config)
    with lantern_server(cfg) as (base, seen):
        wait_until_ready(base)
        engines = json.loads(raw(base, "GET", "/health")[1])["engines"]
        assert engines == {art.path.name: cfg.engine} or cfg.engine == "auto", engines  # it runs what was asked
        yield base, seen


@pytest.fixture(scope="module", params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(smollm2, engine):
    with served(smollm2, limits=Limits(max_queue=16), engine=engine) as (base, _):
        yield base


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def raw(base: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request(method, path, body=body, headers={"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, resp.read()


def llama_cpp_greedy_steps(art: Artifact, messages: list[dict], max_tokens: int) -> list[tuple[int, int, float]]:
    """The greedy answer from llama-cpp-python's own `Llama` on the artifact's GGUF: one sequence,
    evaluated token by token, argmax of its logits (without flash attention, as the engine runs it). Per step:
    (the chosen token, the runner-up, the logit gap between them)."""
    import numpy as np
    from llama_cpp import Llama

    cfg = art.tokenizer_config()
    ids = art.tokenizer().encode(render(cfg["chat_template"], messages), add_special_tokens=False).ids
    llm = Llama(str(art.path / art.manifest["gguf"]["files"][0]), n_ctx=1024, flash_attn=False, logits_all=True, verbose=False)
    llm.eval(ids)
    steps = []
    while len(steps) < max_tokens:
        scores = np.asarray(llm.scores[llm.n_tokens - 1])
        second, token = (int(i) for i in np.argsort(scores)[-2:])
        if token == eos_id(art):
            break
        steps.append((token, second, float(scores[token] - scores[second])))
        llm.eval([token])
    return steps


def llama_cpp_greedy(art: Artifact, messages: list[dict], max_tokens: int) -> str:
    return art.tokenizer().decode([token for token, _, _ in llama_cpp_greedy_steps(art, messages, max_tokens)])


# Batched llama_decode sums in another order than a lone sequence's on some CPUs (llama.cpp does not
# promise batch invariance), so two tokens whose logits are this close may swap.
NEAR_TIE_LOGITS = 0.25


def as_alone(art: Artifact, tokens: list[str], messages: list[dict], max_tokens: int) -> bool:
    """Assert that ``tokens`` (an answer's logprobs tokens) are the lone greedy answer's, or part from it
    once, where the lone run's runner-up is within NEAR_TIE_LOGITS of its choice. True: token for token."""
    tokenizer = art.tokenizer()
    alone = llama_cpp_greedy_steps(art, messages, max_tokens)
    text = [tokenizer.decode([token], skip_special_tokens=False) for token, _, _ in alone]
    k = next((i for i, (a, b) in enumerate(zip(tokens, text)) if a != b), None)
    if k is None:
        assert tokens == text, messages  # the same tokens, and as many
        return True
    _, second, gap = alone[k]
    assert tokens[k] == tokenizer.decode([second], skip_special_tokens=False) and gap < NEAR_TIE_LOGITS, (
        messages,
        k,
        tokens,
        text,
        gap,
    )
    return False


def test_openai_client_greedy_equals_the_engines_reference_and_streams_the_same(client, smollm2, engine):
    """Greedy text equals the engine's own reference: the CPU library run directly (tvm), or
    llama-cpp-python's own `Llama` on the same GGUF (llamacpp)."""
    name = smollm2.path.name
    assert [m.id for m in client.models.list().data] == [name]
    reply = client.chat.completions.create(model=name, messages=user(PROMPTS[0]), max_tokens=32, temperature=0)
    text = reply.choices[0].message.content
    reference = cpu_greedy if engine == "tvm" else llama_cpp_greedy
    assert text == reference(smollm2, user(PROMPTS[0]), 32)
    assert "Paris" in text
    ChatCompletion.model_validate(reply.model_dump())
    assert reply.usage.completion_tokens > 0 and reply.model_extra["lantern_route"] == "cloud"
    stream = client.chat.completions.create(
        model=name, messages=user(PROMPTS[0]), max_tokens=32, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    for c in chunks:
        ChatCompletionChunk.model_validate(c.model_dump())


def test_seeds_and_legacy_completions(client, smollm2):
    name = smollm2.path.name
    ask = dict(model=name, messages=user("Tell me a story about a dragon."), max_tokens=12, temperature=0.8)
    a, b, c = (client.chat.completions.create(**ask, seed=s).choices[0].message.content for s in (7, 7, 8))
    assert a == b != c
    done = client.completions.create(model=name, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert done.choices[0].text.strip() and done.usage.prompt_tokens > 0


def test_a_speculation_field_the_engine_cannot_act_on_is_said(client, smollm2, engine):
    """A request that asks for speculation where the engine makes none of the guesses it asks for (the
    tvm engine; a draft model the artifact lacks) gets a lantern_warnings line naming why, from the
    shared messages; one that does not ask, turns it off, or is served, gets none."""
    from lantern import request_rules

    ask = dict(model=smollm2.path.name, messages=user("hi"), max_tokens=4, temperature=0)

    def said(speculation: dict | None):
        extra = {"extra_body": {"speculation": speculation}} if speculation is not None else {}
        return client.chat.completions.create(**ask, **extra).model_extra.get("lantern_warnings")

    assert said(None) is None and said({"mode": "off"}) is None
    if engine == "tvm":
        why = "the tvm engine does not speculate yet (the llamacpp engine does)"
        assert said({"mode": "lookup"}) == said({}) == [request_rules.message("speculation_ignored", why=why)]
    else:
        assert said({"mode": "lookup"}) is None and said({}) is None
        assert said({"mode": "draft"}) == [
            request_rules.message("speculation_ignored", why="the artifact has no draft model (lantern build --draft)")
        ]


def test_errors_have_openai_shape_and_status(server, client, smollm2):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user("hi"))
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=smollm2.path.name, messages=user("hi"), temperature=5)
    for body in (
        b"{not json",
        b'{"messages": "hi"}',
        b'{"messages": [{"role": "wizard", "content": "x"}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999999": 1}}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}',
    ):
        status, data = raw(server, "POST", "/v1/chat/completions", body)
        assert status == 400, body
        assert set(json.loads(data)["error"]) >= {"message", "type"}
    # chat's constraints on a raw completion: refused by name, not ignored (nor a 500)
    status, data = raw(
        server,
        "POST",
        "/v1/completions",
        json.dumps({"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}}).encode(),
    )
    assert status == 400 and json.loads(data)["error"]["param"] == "response_format", data
    status, _ = raw(server, "POST", "/v1/chat/completions", b"x" * (2 << 20))
    assert status == 413
    for path in (
        "/models/../../etc/passwd",
        "/models/%2e%2e/%2e%2e/etc/passwd",
        "/runtime/../README.md",
        f"/models/{smollm2.path.name}/../../pyproject.toml",
        "/..%2fpyproject.toml",
    ):
        status, _ = raw(server, "GET", path)
        assert status == 404, path
    status, data = raw(server, "GET", f"/models/{smollm2.path.name}/tensor-cache.json", headers={"range": "bytes=0-9"})
    assert status == 206 and len(data) == 10
    status, data = raw(server, "GET", "/metrics")
    text = data.decode()
    assert 'lantern_requests_total{path="/v1/chat/completions",status="400"}' in text
    assert "lantern_ttft_seconds_bucket" in text and "lantern_queue_depth" in text


def test_api_key_is_enforced(smollm2):
    with served(smollm2, api_key="s3cret") as (base, _):
        status, data = raw(base, "GET", "/v1/models")
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        status, _ = raw(base, "GET", "/v1/models", headers={"authorization": "Bearer s3cret"})
        assert status == 200


# Queueing, 429 and cancellation are the server's, not an engine's: run on the fast engine (tvm: +27 s).
@pytest.mark.parametrize("engine_name", ["llamacpp"])
def test_a_full_queue_answers_429_with_retry_after_and_disconnects_free_its_places(smollm2, engine_name):
    """Sixteen long streams fill the queue (a stream is admitted before its headers are sent, and none
    can end early: the end token is banned), so the next requests get 429 whatever the machine's
    speed; once those clients leave, their generations stop and a new stream is served to its end."""
    from openai import OpenAI, RateLimitError

    with served(smollm2, limits=Limits(max_queue=16), engine=engine_name) as (base, _):
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        name = smollm2.path.name
        no_end = {str(eos_id(smollm2)): -100}
        streams = [
            client.chat.completions.create(
                model=name, messages=user(f"Count to {100 + i}."), max_tokens=500, temperature=0, logit_bias=no_end, stream=True
            )
            for i in range(16)
        ]
        assert 'lantern_queue_depth{model="%s"} 16' % name in raw(base, "GET", "/metrics")[1].decode()
        waits = []
        for i in range(4):
            with pytest.raises(RateLimitError) as refused:
                client.chat.completions.create(model=name, messages=user(f"Say {i}."), max_tokens=3, stream=True)
            waits.append(refused.value.response.headers.get("retry-after"))
        assert all(wait and 1 <= int(wait) <= 60 for wait in waits), waits  # each 429 says when to retry

        # clients that disconnect mid-stream: their generations stop early and free their places
        for s in streams:
            assert next(iter(s)).choices[0].finish_reason is None
            s.close()
        for _ in range(600):
            metrics = raw(base, "GET", "/metrics")[1].decode()
            if 'lantern_generations_total{finish_reason="cancelled"} 16' in metrics:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the disconnected streams were not all cancelled")
        assert 'lantern_queue_depth{model="%s"} 0' % name in raw(base, "GET", "/metrics")[1].decode()
        s = client.chat.completions.create(model=name, messages=user("Say 1."), max_tokens=3, temperature=0, stream=True)
        assert [c.choices[0].finish_reason for c in s][-1] in ("stop", "length")


def test_llamacpp_decodes_concurrent_requests_together_and_exactly(smollm2, report):
    """Five different prompts at once: decoded in shared steps, each answer what it is alone, token
    for token, up to a near-tie where the lone run's runner-up won by rounding (and no further)."""
    from openai import OpenAI

    with served(smollm2, engine="llamacpp") as (base, _):
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

        def ask(text: str) -> list[str]:
            reply = client.chat.completions.create(
                model=smollm2.path.name, messages=user(text), max_tokens=24, temperature=0, logprobs=True
            )
            return [t.token for t in reply.choices[0].logprobs.content]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(ask, PROMPTS))
        peak = re.search(r"lantern_batch_sequences_max\{[^}]*\} (\d+)", raw(base, "GET", "/metrics")[1].decode())
        assert int(peak.group(1)) >= 3  # they really shared llama_decode calls
    same = sum(as_alone(smollm2, tokens, user(prompt), 24) for tokens, prompt in zip(together, PROMPTS))
    report(
        f"llama.cpp engine, {len(PROMPTS)} prompts decoded together: {same} token for token as alone, "
        f"{len(PROMPTS) - same} parted at a near-tie (< {NEAR_TIE_LOGITS} logits)"
    )


def test_llamacpp_logits_repeat_bit_for_bit_with_cache_hits_and_neighbours(smollm2, shakespeare_text):
    """A sequence's logits, every step of a greedy answer, are the same bits when its prompt was
    prefilled from scratch in one chunk, found in the cache whole or in part, or run beside other
    sequences' prompts and steps (issue 49: the same request twice gave another answer)."""
    import numpy as np

    from lantern.server.llamacpp import LlamaCppEngine

    tokenizer, template = smollm2.tokenizer(), smollm2.tokenizer_config()["chat_template"]
    ids = tokenizer.encode(shakespeare_text[:4000], add_special_tokens=False).ids
    # a chat prompt (its last token a newline, whose lone row rounds differently) and plain text
    chat = render(template, [{"role": "system", "content": shakespeare_text[:500]}, *user("Who speaks first?")])
    prompt = tokenizer.encode(chat, add_special_tokens=False).ids
    fresh, others = ids[200:330], [ids[400 + 150 * i : 500 + 150 * i + 7 * i] for i in range(3)]
    gguf = smollm2.path / smollm2.manifest["gguf"]["files"][0]
    window, vocab = smollm2.manifest["model"]["context_window"], smollm2.manifest["model"]["vocab_size"]

    def greedy(engine, tokens, steps=16):
        with engine.open(tokens) as session:
            rows = [session.logits]
            for _ in range(steps):
                rows.append(session.step(int(rows[-1].argmax())))
        return session.cached, np.stack(rows)

    lone = LlamaCppEngine(gguf, vocab_size=vocab, context_window=window, slots=1, threads=2)
    try:
        _, reference = greedy(lone, prompt)
        _, fresh_reference = greedy(lone, fresh)
    finally:
        lone.close()
    shared = LlamaCppEngine(gguf, vocab_size=vocab, context_window=window, slots=4, threads=2)
    try:
        before = prompt[:41] + others[0]
        greedy(shared, before)
        cached, rows = greedy(shared, prompt)  # the prefix the two share from the cache, the rest prefilled
        assert cached == next(i for i, (a, b) in enumerate(zip(before, prompt)) if a != b) and np.array_equal(rows, reference)
        cached, rows = greedy(shared, prompt)  # all but the last two prompt tokens from the cache
        assert cached == len(prompt) - 2 and np.array_equal(rows, reference)
        with ThreadPoolExecutor(4) as pool:  # prefilled and decoded beside three other sequences
            runs = list(pool.map(lambda tokens: greedy(shared, tokens, 24), [fresh, *others]))
        assert shared.peak_batch >= 3 and runs[0][0] == 0
        assert np.array_equal(runs[0][1][:17], fresh_reference)
    finally:
        shared.close()


def test_llamacpp_reuses_a_shared_prefix_from_an_idle_or_a_running_sequence(smollm2, shakespeare_text):
    """Requests sharing a long system prompt prefill only what differs, whether the prefix sits in an
    idle slot's cache or in a sequence still generating, and answer as from scratch."""
    from openai import OpenAI

    system = {"role": "system", "content": "Answer in the style of this text.\n" + shakespeare_text[:1500]}
    prefix = len(
        smollm2.tokenizer().encode(render(smollm2.tokenizer_config()["chat_template"], [system]), add_special_tokens=False).ids
    )
    assert prefix > 300
    with served(smollm2, engine="llamacpp") as (base, _):
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

        def ask(question: str, max_tokens: int = 12, **kw):
            return client.chat.completions.create(
                model=smollm2.path.name,
                messages=[system, *user(question)],
                max_tokens=max_tokens,
                temperature=0,
                logprobs=True,
                **kw,
            )

        first = ask("Who speaks first?")
        assert first.usage.model_extra["cached_prompt_tokens"] == 0
        idle = ask("Name a city.")  # the first request's slot is idle: its prefix is reused in place
        assert idle.usage.model_extra["cached_prompt_tokens"] >= prefix - 2
        # a request arriving while another with the same prefix is generating: the prefix is copied over
        stream = ask("Count to fifty.", max_tokens=200, stream=True)
        next(iter(stream))
        running = ask("Name a colour.")
        stream.close()
        assert running.usage.model_extra["cached_prompt_tokens"] >= prefix - 2
        for reply in (first, idle, running):  # OpenAI's field, as the unmodified client reads it
            assert reply.usage.prompt_tokens_details.cached_tokens == reply.usage.model_extra["cached_prompt_tokens"]
    for reply, question in ((idle, "Name a city."), (running, "Name a colour.")):
        as_alone(smollm2, [t.token for t in reply.choices[0].logprobs.content], [system, *user(question)], 12)


def test_tvm_keeps_conversations_cached_between_turns(smollm2, shakespeare_text, report):
    """Two chats with long system prompts, interleaved: each one's second turn reuses its own first
    turn from the KV cache (the other chat ran in between), OpenAI's field says so, and the answer
    is the CPU library's from scratch."""
    from openai import OpenAI

    chats = [
        [{"role": "system", "content": "Answer in the style of this text.\n" + shakespeare_text[i : i + 900]}] for i in (0, 5000)
    ]
    with served(smollm2, engine="tvm") as (base, _):
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

        def turn(messages, question):
            messages.append(user(question)[0])
            reply = client.chat.completions.create(model=smollm2.path.name, messages=messages, max_tokens=8, temperature=0)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            return reply

        first = [turn(chat, "Who speaks first?") for chat in chats]
        second = [turn(chat, "And then?") for chat in chats]
    for one, two, chat in zip(first, second, chats):
        assert one.usage.prompt_tokens_details.cached_tokens < 20  # only the template's first tokens are shared
        assert two.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens
        assert two.usage.model_extra["cached_prompt_tokens"] == two.usage.prompt_tokens_details.cached_tokens
        assert two.choices[0].message.content == cpu_greedy(smollm2, chat[:-1], 8)
    report(
        f"lantern serve (tvm), a chat's second turn with another chat in between: TTFT "
        f"{first[0].usage.model_extra['ttft_ms'] / 1000:.2f} s ({first[0].usage.prompt_tokens} prompt tokens) -> "
        f"{second[0].usage.model_extra['ttft_ms'] / 1000:.2f} s ({second[0].usage.prompt_tokens_details.cached_tokens}"
        f" of {second[0].usage.prompt_tokens} cached)"
    )


def test_the_engine_is_chosen_by_rule_and_a_wrong_choice_says_how_to_fix_it(
    tiny_q4, tiny_hf, build_artifact, monkeypatch, capsys
):
    from lantern.cli import main
    from lantern.errors import LanternError
    from lantern.server import llamacpp
    from lantern.server.engine import Generator, choose_engine

    no_gguf = Artifact.open(build_artifact(tiny_hf[0], "q0f32"))  # the CPU library only
    assert choose_engine(tiny_q4) == ("llamacpp", "the artifact has a GGUF")
    assert choose_engine(tiny_q4, "tvm") == ("tvm", "asked for")
    assert choose_engine(no_gguf) == ("tvm", "the artifact has no GGUF")
    with pytest.raises(LanternError, match="has no GGUF.*--targets webgpu,cpu,gguf"):
        choose_engine(no_gguf, "llamacpp")
    with pytest.raises(LanternError, match="unknown engine 'vllm'"):
        choose_engine(tiny_q4, "vllm")
    generator = Generator(tiny_q4.path, slots=2, threads=1)
    assert generator.describe().startswith("engine llamacpp (")
    assert re.search(r"2 parallel sequences of up to \d+ tokens, 1 threads", generator.describe()), generator.describe()
    generator.close()
    for flag in ("--parallel", "--threads"):
        assert main(["serve", str(tiny_q4.path), flag, "0"]) == 1
        assert f"{flag} must be at least 1" in capsys.readouterr().err
    # without the llamacpp extra (a fault this machine cannot have): tvm, saying what to install
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    engine, why = choose_engine(tiny_q4)
    assert engine == "tvm" and "pip install 'lantern-llm[llamacpp]'" in why
    with pytest.raises(LanternError, match=r"needs llama-cpp-python: pip install 'lantern-llm\[llamacpp\]'"):
        choose_engine(tiny_q4, "llamacpp")


def test_dry_penalties_follow_their_definition():
    """DRY's Z-algorithm against its definition, on random token strings with many repeats: for each
    token, the longest run of tokens just before an earlier occurrence of it that equals the window's
    end; a penalty where that run reaches the allowed length, within the last n tokens."""
    import random

    from lantern.server.sampler import dry_penalties

    def by_definition(history: list[int], p: SamplingParams) -> dict[int, float]:
        w = history[-p.dry_penalty_last_n :] if p.dry_penalty_last_n > 0 else history
        n, longest = len(w), {}
        for j in range(n - 1):  # w[j + 1] follows a run ending at j
            m = 0
            while m <= j and w[j - m] == w[n - 1 - m]:
                m += 1
            if m >= p.dry_allowed_length and n > p.dry_allowed_length:
                longest[w[j + 1]] = max(longest.get(w[j + 1], 0), m)
        return {t: p.dry_multiplier * p.dry_base ** (m - p.dry_allowed_length) for t, m in longest.items()}

    rng = random.Random(0)
    for _ in range(300):
        history = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        p = SamplingParams(
            dry_multiplier=rng.choice([0.8, 2.0]),
            dry_base=rng.choice([1.75, 1.1]),
            dry_allowed_length=rng.randrange(1, 4),
            dry_penalty_last_n=rng.choice([-1, 5, 12]),
        )
        got, want = dry_penalties(history, p), by_definition(history, p)
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) <= 1e-9 * want[t] for t in want), history
    # a run of one digit: the penalty on writing it once more grows with the run
    p = SamplingParams(dry_multiplier=0.8)
    assert [dry_penalties([9] * n, p).get(9, 0) for n in (2, 3, 5)] == [0, 0.8, 0.8 * 1.75**2]


def test_python_and_browser_samplers_agree(smollm2):
    """Same seed, same draws: the Python sampler against the runtime's, on identical logits, at a
    small vocabulary and at Gemma 3's 262,144 (where neither sorts it: top-p's nucleus is ranked
    64 candidates at a time, growing eightfold, and a plain draw walks the tokens in order). DRY
    and the other penalties, with their prompt, alike."""
    import numpy as np
    from browser import chromium

    rng = np.random.default_rng(0)
    cases = [
        dict(temperature=0.8, seed=7),
        dict(temperature=1.2, top_p=0.9, seed=11),
        dict(temperature=0.7, top_k=20, seed=3, repetition_penalty=1.3, presence_penalty=0.5),
        dict(temperature=0.5, top_p=0.5, top_k=300, seed=2),
        dict(temperature=0.9, seed=5, mask=True),
        dict(temperature=0, mask=True),
        dict(temperature=0, mask=True, nan=True),
        dict(temperature=0.9, seed=5, mask=True, nan=True),
        dict(temperature=1.0, top_p=0.95, seed=9, mask=True, nan=True),
        # DRY over the prompt and the answer: fixed logits would repeat the greedy token forever
        dict(temperature=0, dry_multiplier=0.8, prompt=[1, 2, 3, 1, 2]),
        dict(temperature=0, dry_multiplier=0.5, dry_base=2.0, dry_allowed_length=3, dry_penalty_last_n=9, mask=True),
        dict(temperature=0.9, seed=4, dry_multiplier=0.8, prompt=[7, 7, 7, 7]),
        # penalties over the prompt too, as llama.cpp (the wasm device) counts them
        dict(temperature=0, repetition_penalty=1.5, frequency_penalty=0.4, prompt=[1, 2, 3, 3, 5]),
    ]
    vocabularies = []
    for size, spread in ((512, 3.0), (262144, 2.0)):
        logits = (rng.standard_normal(size) * spread).astype(np.float32)
        vocabularies.append((logits, sorted(rng.choice(size, 40, replace=False).tolist())))  # a grammar's mask
    py = []
    for logits, allowed in vocabularies:
        for c in cases:
            s = Sampler(SamplingParams(**{k: v for k, v in c.items() if k not in ("mask", "nan", "prompt")}), c.get("prompt", []))
            mask = None
            if c.get("mask"):
                mask = np.zeros(len(logits), bool)
                mask[allowed] = True
            source = np.full(len(logits), np.nan, np.float32) if c.get("nan") else logits
            toks = []
            for _ in range(20):
                t = s.sample(source, mask).token
                s.accept(t)
                toks.append(t)
            if c.get("mask"):
                assert set(toks) <= set(allowed)  # a broken model's NaNs included
            if c.get("dry_multiplier") and c["temperature"] == 0:
                assert len(set(toks)) > 1  # the repeats were broken
            py.append(toks)
    with lantern_server([smollm2.path]) as (base, _), chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/engine.html")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        js = []
        for logits, allowed in vocabularies:
            js += page.evaluate(
                """([logits, allowed, cases]) => cases.map((c) => {
                const s = new lantern.Sampler(lantern.samplingParams(c, logits.length), c.prompt ?? []);
                let mask;
                if (c.mask) {
                  mask = new Int32Array(logits.length / 32);
                  for (const id of allowed) mask[id >> 5] |= 1 << (id & 31);
                }
                const source = c.nan ? new Float32Array(logits.length).fill(NaN) : Float32Array.from(logits);
                const out = [];
                for (let i = 0; i < 20; i++) { const t = s.sample(source, mask).token; s.accept(t); out.push(t); }
                return out;
            })""",
                [logits.tolist(), allowed, cases],
            )
        # a prompt's tokens are penalized: the greedy token, once in the prompt, loses its place
        logits = vocabularies[0][0]
        top = int(np.argmax(logits))
        in_browser = page.evaluate(
            """([logits, top]) => {
            const p = lantern.samplingParams({ temperature: 0, presence_penalty: 2 }, logits.length);
            const l = Float32Array.from(logits);
            return [new lantern.Sampler(p).sample(l).token, new lantern.Sampler(p, [top]).sample(l).token];
        }""",
            [logits.tolist(), top],
        )
        p = SamplingParams(temperature=0, presence_penalty=2.0)
        assert in_browser == [top, Sampler(p, [top]).sample(logits).token] and in_browser[1] != top
        first = page.evaluate("() => { const r = new lantern.Rng(42); return [r.next(), r.next(), r.next()]; }")
    r = Rng(42)
    assert first == [r.next(), r.next(), r.next()]
    assert js == py
