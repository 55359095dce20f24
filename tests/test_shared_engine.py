"""One engine for every tab of an origin: createEngine({ shared: true }) in headless Chromium.

Pages of one browser context load the tiny model on the `webgpu` device (SwiftShader) through the
origin's SharedWorker: the second page finds it loaded (no request to the server), requests from two
pages are taken in turn, a page that closes mid-stream has only its own request cancelled, a navigation
finds the model still loaded, and another model loads on its own. The `wasm` device cannot run in a
SharedWorker (llama.cpp starts Web Workers, which Chromium's SharedWorker cannot): the first tab's
dedicated worker runs it for every tab, and hands it over when that tab closes.
"""

from __future__ import annotations

import time

import pytest

from browser import lantern_server
from test_runtime import open_page
from test_smollm2 import eos_id

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build]

TIMED_LOAD = """async ([m, o]) => {
  const t = performance.now();
  const stats = await load(m, { shared: true, ...o });
  return { ms: performance.now() - t, stats };
}"""

# Requests sent at once from one page; each resolves to the wall-clock time it ended.
SEND = """(reqs) => { window.ended = Promise.all(reqs.map(async (r) => {
  const reply = await engine.chat.completions.create(r);
  return { at: performance.timeOrigin + performance.now(), tokens: reply.usage.completion_tokens, finish: reply.choices[0].finish_reason };
})); return true; }"""


@pytest.fixture(scope="module")
def served(tiny_q4, tmp_path_factory):
    # the same artifact under a second name: another model for the origin
    other = tmp_path_factory.mktemp("other") / "tiny-other"
    other.symlink_to(tiny_q4.path)
    with lantern_server([tiny_q4.path, other]) as (base, seen):
        yield base, seen, f"/models/{tiny_q4.path.name}/", "/models/tiny-other/"


@pytest.fixture()
def context(browser):
    """A browser context of its own: its own SharedWorker, storage and Web Locks."""
    c = browser.new_context()
    yield c
    c.close()


def wait_queued(page, n: int) -> None:
    """Until ``n`` requests of the shared engine wait for their turn (as ``page`` sees it)."""
    deadline = time.monotonic() + 60
    while page.evaluate("engine.stats()")["queued"] < n:
        assert time.monotonic() < deadline, "the requests never queued"
        time.sleep(0.02)


def model_requests(seen, mark: int) -> list[str]:
    return [p for p, _ in seen[mark:] if p.startswith("/models/")]


def test_tabs_share_one_engine_fairly_and_a_closed_tab_cancels_only_its_own(served, context, tiny_q4, report):
    base, seen, model, other_model = served
    a = open_page(context, base)
    first = a.evaluate(TIMED_LOAD, [model, {}])
    assert first["stats"]["host"] == {"kind": "shared", "tabs": 1, "models": 1}

    # the second page: the loaded engine, no download and no verification
    b = open_page(context, base)
    mark = len(seen)
    second = b.evaluate(TIMED_LOAD, [model, {}])
    assert model_requests(seen, mark) == []
    assert second["stats"]["host"] == {"kind": "shared", "tabs": 2, "models": 1}
    assert a.evaluate("engine.stats()")["host"]["tabs"] == 2
    report(
        f"shared engine: first page's load {first['ms']:.0f} ms, second page's {second['ms']:.0f} ms "
        f"({first['ms'] / max(second['ms'], 1):.0f}x faster), 0 requests to the server"
    )

    # in turn: page a sends three requests (a long one first), then b one while a's first runs;
    # b's is answered before a's last (one queue for all pages would answer it last)
    req = {
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 24,
        "temperature": 0,
        "logit_bias": {str(eos_id(tiny_q4)): -100},
    }
    a.evaluate(SEND, [{**req, "max_tokens": 160}, req, req])
    wait_queued(b, 2)  # a's first runs, its other two wait
    b.evaluate(SEND, [req])
    ended_a = a.evaluate("ended")
    [ended_b] = b.evaluate("ended")
    assert [r["tokens"] for r in ended_a][1:] == [24, 24] and ended_b["tokens"] == 24
    order = sorted([("a", r["at"]) for r in ended_a] + [("b", ended_b["at"])], key=lambda x: x[1])
    # Right after a's first, as a rule; after a's second where b's request reached the worker once a's
    # first had ended, or where a page saw its reply late (each page stamps the time it got its reply:
    # CI once saw a's second and b's 0.5 ms apart, one request's time after a's first)
    assert [who for who, _ in order][::3] == ["a", "a"], order

    # page a streams a long answer; b's request waits for its turn; a closes mid-stream
    a.evaluate(
        """(r) => { window.got = 0; (async () => {
      for await (const c of await engine.chat.completions.create({ ...r, stream: true })) window.got++;
    })(); return true; }""",
        {**req, "max_tokens": 2000},
    )
    a.wait_for_function("window.got >= 3")
    before = b.evaluate("engine.stats()")["requests"]
    b.evaluate(SEND, [req])
    a.close()
    [after_close] = b.evaluate("ended")
    assert after_close["tokens"] == 24 and after_close["finish"] == "length"
    stats = b.evaluate("engine.stats()")
    assert stats["requests"].get("cancelled", 0) == before.get("cancelled", 0) + 1  # a's, not b's
    assert stats["host"]["tabs"] == 1 and stats["kvSequences"] <= 1 and stats["queued"] == 0

    # a navigation finds the model loaded (the SharedWorker outlives the page, the model its grace period)
    b.goto(base + "/engine.html")
    b.wait_for_function("document.getElementById('status').textContent === 'ready'")
    mark = len(seen)
    again = b.evaluate(TIMED_LOAD, [model, {}])
    assert model_requests(seen, mark) == [] and again["stats"]["host"]["tabs"] == 1

    # another model of the origin loads on its own and leaves the first alone
    c = open_page(context, base)
    mark = len(seen)
    own = c.evaluate(TIMED_LOAD, [other_model, {}])
    assert f"{other_model}lantern.json" in model_requests(seen, mark)
    assert own["stats"]["host"] == {"kind": "shared", "tabs": 1, "models": 2}
    b.evaluate(SEND, [req])
    assert b.evaluate("ended")[0]["tokens"] == 24


def gguf_requests(seen, mark: int) -> list[str]:
    return [p for p in model_requests(seen, mark) if ".gguf" in p]


# A stream that lasts while the host tab closes; resolves to how it ended.
LONG_STREAM = """async (r) => {
  let chunks = 0;
  try {
    for await (const c of await engine.chat.completions.create(r)) chunks++;
    return { chunks };
  } catch (e) { return { chunks, error: e.name, message: e.message }; }
}"""


def test_on_the_wasm_device_one_tabs_worker_serves_every_tab_and_hands_over(served, context, report):
    """The SharedWorker cannot run llama.cpp (it cannot start Workers): the first tab's dedicated worker
    runs the engine, and the next tab reaches it through a port the SharedWorker brokers, with no
    download and no second model. When the host tab closes, the other tab takes the engine over."""
    base, seen, model, _ = served
    wasm = {"device": "wasm", "contextWindow": 2048}
    a = open_page(context, base)
    mark = len(seen)
    first = a.evaluate(TIMED_LOAD, [model, wasm])
    assert gguf_requests(seen, mark), "the first tab downloads the GGUF"
    host = first["stats"]["host"]
    assert (host["kind"], host["tabs"], host["models"], host["handovers"]) == ("dedicated", 1, 1, 0), host
    assert "SharedWorker" in host["fallback"], host
    b = open_page(context, base)
    mark = len(seen)
    second = b.evaluate(TIMED_LOAD, [model, wasm])
    assert gguf_requests(seen, mark) == []
    host = second["stats"]["host"]
    assert (host["kind"], host["tabs"], host["models"]) == ("tab", 2, 1), host
    assert a.evaluate("engine.stats()")["host"]["tabs"] == 2
    report(f"wasm across tabs (Chromium): first tab's load {first['ms']:.0f} ms, second tab's {second['ms']:.0f} ms")
    assert second["ms"] < first["ms"] / 5, (first["ms"], second["ms"])
    req = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    [from_a], [from_b] = a.evaluate("(r) => chat([r])", req), b.evaluate("(r) => chat([r])", req)
    assert from_b["choices"][0]["message"] == from_a["choices"][0]["message"]

    # the host tab closes mid-stream of the other: that stream fails as a crash does (the router goes
    # on from the cloud); the tab then runs the engine itself, from the cache
    b.evaluate("(r) => { window.long = (" + LONG_STREAM + ")(r); }", {**req, "max_tokens": 1500, "stream": True})
    b.wait_for_function("engine.stats().then((s) => s.kvSequences > 0)")
    mark = len(seen)
    a.close()
    ended = b.evaluate("window.long")
    assert ended.get("error") == "WorkerCrashedError" and "has gone" in ended["message"], ended
    [again] = b.evaluate("(r) => chat([r])", req)
    assert again["choices"][0]["message"] == from_a["choices"][0]["message"]
    host = b.evaluate("engine.stats()")["host"]
    assert (host["kind"], host["tabs"], host["handovers"]) == ("dedicated", 1, 1), host
    assert gguf_requests(seen, mark) == [], "the new host loads the GGUF from the cache"


def test_a_crash_of_the_shared_worker_fails_every_tabs_calls_with_worker_crashed(served, context):
    base, _, model, _ = served
    a, b = open_page(context, base), open_page(context, base)
    for page in (a, b):
        assert page.evaluate("(m) => load(m, { shared: true })", model)["host"]["kind"] == "shared"
    a.evaluate("engine.debugCrash()")
    for page in (a, b):
        page.wait_for_function("errorOf(() => engine.stats()).then((e) => (window.crashed = e))")
        err = page.evaluate("window.crashed")
        assert err and err["name"] == "WorkerCrashedError" and "debug-crash" in err["message"], err
