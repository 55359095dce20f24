"""Speculative decoding in the llamacpp engine (server/speculation.py): guesses from the grammar's forced
text, from prompt lookup and from a draft model, checked in one forward pass, leave every answer as it is
without them."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_runtime import user

from lantern.runtime.artifact import Artifact
from lantern.server.speculation import Lookup, best_k

JSONSCHEMABENCH = Path(__file__).resolve().parents[2] / "shared" / "jsonschemabench"


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_tail():
    lookup = Lookup([5, 6, 7, 8, 9, 1, 6, 7, 3, 4])
    for token in (2, 6, 7):
        lookup.push(token)
    assert lookup.propose(2) == [3, 4]  # (6, 7) last ended before 3: the later occurrence wins
    lookup.push(8)  # the three-token tail (6, 7, 8) is the prompt's start
    assert lookup.propose(3) == [9, 1, 6]
    assert Lookup([1, 2, 3]).propose(4) == []  # a tail seen nowhere before
    assert Lookup([4, 4]).propose(3) == [4]  # what follows may be the tail itself


def test_drafts_are_proposed_only_where_they_pay():
    def line(c: float) -> list[float]:
        return [1 + c * k for k in range(17)]

    assert best_k(0.2, line(0.3), 16) == 0  # accepted less often than one more row costs: no speculation
    assert best_k(0.5, line(0.3), 16) == 1
    assert best_k(0.8, line(0.3), 16) == 3
    assert best_k(0.99, line(0.05), 16) == 16 and best_k(0.99, line(0.05), 5) == 5
    assert best_k(0.7, [1.0, 1.55, 2.05, 1.9, 2.5], 16) == 3  # four tokens cost less than three (a CPU's kernels)


@pytest.fixture(scope="module")
def llamacpp_engine(smollm2_q4: Artifact):
    from lantern.server.engine import Generator

    generator = Generator(smollm2_q4.path, "llamacpp", slots=4, threads=2)
    yield generator
    generator.close()


def answer(generator, body: dict, mode: str):
    """The engine's text for a chat request with ``speculation.mode`` = ``mode``, and its usage
    (ci/bench/bench_speculation.py asks through this too)."""
    from lantern.server.engine import Stop
    from lantern.server.protocol import ChatCompletionRequest
    from lantern.server.structured import request_spec

    req = ChatCompletionRequest(**body, speculation={"mode": mode})
    fmt = req.response_format.model_dump(exclude_none=True) if req.response_format else None
    spec = request_spec(fmt, [], None, True, req.schema_defaults.model_dump())
    prompt = generator.encode(generator.render_chat([m.model_dump(exclude_none=True) for m in req.messages]))
    steps: list = []
    generator.generate(prompt, req, Stop(), steps.append, grammar=generator.compile_grammar(spec))
    return "".join(s.delta for s in steps), steps[-1].usage


def schema_requests(count: int, max_tokens: int) -> list[dict]:
    """The first ``count`` schemas of JSONSchemaBench's Github_easy split, as ci/bench/jsonschemabench.py asks."""
    rows = [json.loads(line) for line in (JSONSCHEMABENCH / "Github_easy.jsonl").read_text().splitlines()[:count]]
    return [
        {
            "messages": [
                {"role": "system", "content": "You answer with one JSON value that satisfies the user's JSON Schema."},
                {"role": "user", "content": f"JSON Schema:\n{json.dumps(row['schema'])[:3000]}\nWrite one example."},
            ],
            "response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": row["schema"]}},
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        for row in rows
    ]


QUOTING = (
    "Copy this sentence exactly, then stop: The quick brown fox jumps over the lazy dog near the river bank.",
    "Rewrite in the past tense: I walk to the market, I buy some bread, and I go home.",
)


def test_answers_with_speculation_are_the_answers_without_it(llamacpp_engine, report):
    """At temperature 0, JSON answers under a schema and free answers that quote their prompt are the same
    text with speculation off and with each source of drafts, alone and four at a time; each source gets
    drafts accepted; and with sampling, a seed gives the same answer with and without it (a draft is kept
    only when the model's own sample is that draft)."""
    generator = llamacpp_engine
    cases = schema_requests(4, 96) + [{"messages": user(q), "temperature": 0, "max_tokens": 48} for q in QUOTING]
    totals = {"grammar": [0, 0], "lookup": [0, 0]}
    tokens = passes = 0
    offs = []
    for body in cases:
        off, off_usage = answer(generator, body, "off")
        assert off_usage.speculation is None
        offs.append(off)
        for mode in ("auto", "grammar", "lookup"):
            text, full = answer(generator, body, mode)
            assert text == off, (mode, body["messages"][-1]["content"][:60])
            assert full.speculation is not None
            usage = full.speculation.model_dump()
            if mode == "auto":
                for source in totals:
                    totals[source][0] += usage[source]["proposed"]
                    totals[source][1] += usage[source]["accepted"]
                passes += usage["forward_passes"]
                tokens += len(generator.encode(text))
    assert totals["grammar"][1] > 0 and totals["lookup"][1] > 0
    with ThreadPoolExecutor(4) as pool:  # four at a time: their steps and drafts share llama_decode calls
        assert list(pool.map(lambda body: answer(generator, body, "auto")[0], cases)) == offs
    assert generator.engine.peak_batch >= 2
    assert passes < tokens  # fewer forward passes than tokens: drafts saved some
    sampled = {"messages": user("Tell me a story about a dragon."), "temperature": 0.9, "max_tokens": 24}
    for seed in (1, 2, 3):
        assert answer(generator, {**sampled, "seed": seed}, "off")[0] == answer(generator, {**sampled, "seed": seed}, "auto")[0]
    report(
        f"speculation, {len(cases)} answers the same with and without it; drafts accepted/proposed: grammar "
        f"{totals['grammar'][1]}/{totals['grammar'][0]}, lookup {totals['lookup'][1]}/{totals['lookup'][0]}; "
        f"{passes} forward passes for about {tokens} tokens"
    )


def test_verified_rows_are_the_rows_of_single_steps(smollm2_q4: Artifact):
    """The logits a verify pass returns for each of its tokens are, bit for bit, those of feeding the same
    tokens one step at a time, and dropping rejected drafts leaves the sequence as if they were never fed."""
    import numpy as np

    from lantern.server.llamacpp import LlamaCppEngine

    art = smollm2_q4
    gguf = art.path / art.manifest["gguf"]["files"][0]
    prompt = art.tokenizer().encode("The capital of France is Paris, and the capital of Italy is", add_special_tokens=False).ids
    engine = LlamaCppEngine(gguf, vocab_size=art.manifest["model"]["vocab_size"], context_window=1024, slots=2, threads=2)
    try:
        assert engine.rows_exact and len(engine.pass_costs) == 17 and engine.pass_costs[0] == 1.0
        with engine.open(prompt) as session:
            steps, greedy = [session.logits], []
            for _ in range(8):
                greedy.append(int(steps[-1].argmax()))
                steps.append(session.step(greedy[-1]))
        with engine.open(prompt[:-2]) as session:  # the last two prompt tokens come with the check
            rows = session.verify(prompt[-2:] + greedy[:3] + [7, 8])  # three right drafts, two wrong ones
            assert np.array_equal(rows[1:5], np.stack(steps[:4]))
            rows = session.verify(greedy[3:], drop=2)  # the wrong ones leave; the rest of the answer comes
            assert np.array_equal(rows, np.stack(steps[4:]))
    finally:
        engine.close()


def test_a_draft_model_changes_no_answer(build_artifact, report, monkeypatch):
    """SmolLM2 unquantized, carrying a 4-bit copy of itself as its draft (`lantern build --draft q4f32_1`):
    the engine loads both and, timing them, asks for the draft's guesses; answers at temperature 0 and
    with a seed are the same with them as without any, one at a time and three at a time (the draft's
    steps batched across sequences), and most guesses are kept."""
    from lantern.server.engine import Generator
    from lantern.server.llamacpp import LlamaCppEngine

    # The draft's cost held at what it measures on an idle machine: on a busy one (the suite's other
    # workers) the engine may rightly find that no draft pays, and this test is about the answers.
    monkeypatch.setattr(LlamaCppEngine, "_probe_draft", lambda self, one: 0.25)
    monkeypatch.setattr(LlamaCppEngine, "_observe_draft", lambda self, *_: None)
    art = Artifact.open(build_artifact("smollm2", "q0f32", targets=("cpu", "gguf"), draft="q4f32_1"))
    draft = art.manifest["draft"]
    assert draft["source"] == "q4f32_1" and all(f in art.manifest["files"] for f in draft["files"])
    generator = Generator(art.path, "llamacpp", slots=3, threads=2)
    try:
        assert "draft model" in generator.describe()
        questions = ("Why is the sky blue?", "Write a haiku about autumn.", "What is a prime number?")
        cases = [{"messages": user(q), "temperature": 0, "max_tokens": 40} for q in questions]
        cases += [{"messages": user("Tell me a story."), "temperature": 0.8, "seed": seed, "max_tokens": 40} for seed in (1, 2)]
        offs = [answer(generator, body, "off")[0] for body in cases]
        proposed = accepted = 0
        for body, off in zip(cases, offs):
            text, usage = answer(generator, body, "draft")
            assert text == off, body
            proposed += usage.speculation.draft.proposed
            accepted += usage.speculation.draft.accepted
        assert accepted > proposed / 3
        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(lambda body: answer(generator, body, "auto")[0], cases)) == offs
    finally:
        generator.close()
    report(f"draft model: {len(cases)} answers the same with and without it; its guesses kept {accepted}/{proposed}")
