"""The runtime in every engine people browse with: Chromium (Blink), Firefox ESR (Gecko) and WebKitGTK
(WebKit and JavaScriptCore, Safari's engine), each the system's own, headless (lantern.browsers).

None of them has a GPU here (and Firefox on Linux and Debian's WebKitGTK have no WebGPU at all), so
every case runs on the `wasm` device: llama.cpp's default build in Chromium and Firefox, its compat
build in WebKit (JavaScriptCore has no memory64). Which cases run where, and why:
- in every engine, once, in one page (one cold load each; WebKit's takes about 25 s): load, greedy
  answers equal to Chromium's, streaming, a JSON-schema answer, abort, reload from the cache, the
  router's mid-stream fallback to the cloud; in Firefox and WebKit the chat page answering locally
  and the capability page (test_site.py has both in Chromium);
- storage that fails for real (Firefox: a quota too small for the model; WebKit: OPFS and the Storage
  API off, as MiniBrowser ships; Chromium's quota is in test_runtime.py);
- threads where they differ: Firefox's SharedWorker (not cross-origin isolated, so a tab's dedicated
  worker runs the engine for every tab, and a second tab finds it loaded) and WebKit without
  SharedArrayBuffer.
Chromium's own suites (test_wasm_device.py, test_site.py) cover the rest in Chromium.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path

import pytest

from browser import lantern_server, repo_root, wait_until_ready
from structured_cases import SCHEMAS
from test_smollm2 import PROMPTS

from lantern.browsers import ENGINES, once_more_if_firefox_hangs, open_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# A Firefox session that hangs is given up after HANG_S and run once more, with a warning
# (lantern.browsers.once_more_if_firefox_hangs; the longest call, three greedy answers in WebKit's
# compat build beside the rest of the suite, takes about 40 s).
HANG_S = 120

GREEDY = [{"messages": [{"role": "user", "content": p}], "max_tokens": 24, "temperature": 0} for p in PROMPTS[:3]]
# The same in every engine, so that greedy answers are comparable; one, because llama.cpp's threads wait
# for each other by spinning: beside the rest of the suite on 2 cores, WebKit's compat build on 2 threads
# took over 120 s for these three answers in CI. Threads are shown by the Firefox tabs test and WebKit's.
THREADS = 1


@pytest.fixture(scope="module")
def smollm2(smollm2_q4, tmp_path_factory) -> Path:
    link = tmp_path_factory.mktemp("served") / "smollm2"  # served as /models/smollm2/, as the site expects
    link.symlink_to(smollm2_q4.path)
    return link


@pytest.fixture(scope="module")
def server(smollm2):
    with lantern_server([smollm2]) as (base, seen):
        wait_until_ready(base)  # the cloud the router falls back to
        yield base, seen


def engine_page(browser, base: str):
    page = browser.new_page()
    page.goto(base + "/engine.html")
    page.wait_for("document.getElementById('status').textContent === 'ready'")
    return page


def in_browser(name: str, fn, **options):
    """``fn(browser)`` in a fresh headless ``name``; in Firefox, once more after a hang (see HANG_S)."""

    def run():
        with open_browser(name, webgpu=False, timeout=HANG_S, **options) as browser:
            return fn(browser)

    return once_more_if_firefox_hangs(name, run, HANG_S, warnings.warn)


def gguf_fetches(seen, since: int) -> list[str]:
    return [p for p, _ in seen[since:] if p.startswith("/models/") and ".gguf" in p]


def core_cases(name: str, base: str, seen: list) -> dict:
    """The runtime's core cases in engine ``name``, in one page; what each gave."""
    return in_browser(name, lambda browser: _core_cases(browser, base, seen))


def _core_cases(browser, base: str, seen: list) -> dict:
    out: dict = {}
    page = engine_page(browser, base)
    mark = len(seen)
    started = time.perf_counter()
    out["stats"] = page.evaluate("(m) => load(m, { device: 'auto', threads: %d })" % THREADS, "/models/smollm2/")
    out["cold_load_s"] = time.perf_counter() - started
    out["cold_fetched"] = gguf_fetches(seen, mark)
    out["greedy"] = [r["choices"][0]["message"]["content"] for r in page.evaluate("(r) => chat(r)", GREEDY)]
    [out["stream"]] = page.evaluate("(r) => chat(r)", [{**GREEDY[0], "stream": True}])
    schema = SCHEMAS["flat_required"]
    [reply] = page.evaluate(
        "(r) => chat(r)",
        [
            {
                "messages": [{"role": "user", "content": "Describe a person."}],
                "max_tokens": 60,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
            }
        ],
    )
    out["json"] = reply["choices"][0]["message"]["content"]
    out["json_problem"] = page.evaluate("([s, t]) => ajvCheck(s, t)", [schema, out["json"]])
    out["aborted"] = page.evaluate("(r) => chatAborted(r, 2)", {**GREEDY[1], "max_tokens": 200})
    page.evaluate("() => engine.unload()")
    mark = len(seen)
    started = time.perf_counter()
    out["cached_stats"] = page.evaluate("(m) => load(m, { device: 'auto', threads: %d })" % THREADS, "/models/smollm2/")
    out["cached_load_s"] = time.perf_counter() - started
    out["cached_fetched"] = gguf_fetches(seen, mark)
    [again] = page.evaluate("(r) => chat(r)", GREEDY[:1])
    out["cached_greedy"] = again["choices"][0]["message"]["content"]
    page.evaluate("() => engine.unload()")
    # the local engine crashes two chunks into a stream: the router goes on from the cloud
    out["router"] = page.evaluate(
        "([o, r]) => routerChat(o, r, 2, 'crash')",
        [
            {
                "local": {"model": "/models/smollm2/", "device": "auto", "threads": THREADS},
                "cloud": {"baseURL": base + "/v1", "model": "smollm2"},
            },
            {**GREEDY[0], "max_tokens": 12, "stream": True},
        ],
    )
    return out


@pytest.fixture(scope="module")
def runs(server) -> dict[str, dict]:
    base, seen = server
    return {name: core_cases(name, base, seen) for name in ENGINES}


@pytest.mark.parametrize("name", ENGINES)
def test_core_cases_run_locally_in_every_engine(runs, name, report):
    run = runs[name]
    stats = run["stats"]
    assert stats["device"] == "wasm" and stats["host"]["kind"] == "dedicated"
    # the build by feature detection: JavaScriptCore has no memory64
    assert stats["wasm"]["build"] == ("compat" if name == "webkit" else "default"), stats["wasm"]
    assert stats["wasm"]["threads"] == THREADS and stats["deviceLabel"].endswith(f"{THREADS} thread)")
    assert stats["storage"] == {"backend": "cache-api", "note": None}
    assert run["cold_fetched"], "the first load downloads the GGUF"
    assert run["stream"]["text"] == run["greedy"][0] and run["stream"]["finish"] in ("stop", "length")
    assert run["json_problem"] is None, (run["json"], run["json_problem"])
    assert run["aborted"]["finish"] == "abort", run["aborted"]
    # a reload takes the model from the cache: no GGUF fetched, the same answer
    assert run["cached_fetched"] == [] and run["cached_greedy"] == run["greedy"][0]
    events = [e["type"] for e in run["router"]["events"]]
    assert "fallback" in events, run["router"]["events"]
    assert run["router"]["text"].strip()
    report(
        f"{name}: {stats['deviceLabel']} ({stats['wasm']['build']} build), cold load {run['cold_load_s']:.1f} s, "
        f"cached {run['cached_load_s']:.1f} s"
    )


@pytest.mark.parametrize("name", ["firefox", "webkit"])
def test_greedy_answers_equal_chromiums(runs, name):
    assert runs[name]["greedy"] == runs["chromium"]["greedy"]


def chat_page(browser, base: str) -> tuple[list[str], str]:
    """Load the first model on the chat page and ask it; the route shown and the answer."""
    page = browser.new_page()
    page.goto(base + "/index.html")
    page.wait_for("document.getElementById('model').options.length > 0")
    page.evaluate("() => document.getElementById('load').click()")
    page.wait_for("document.getElementById('send').disabled === false", timeout=HANG_S)
    route = page.evaluate("() => [document.getElementById('route').dataset.route, document.getElementById('route').textContent]")
    page.evaluate(
        "() => { document.getElementById('prompt').value = 'What is the capital of France?'; "
        "document.getElementById('ask').requestSubmit(); }"
    )
    page.wait_for(
        "document.querySelector('.msg-assistant') && document.getElementById('send').disabled === false", timeout=HANG_S
    )
    return route, page.evaluate("() => document.querySelector('.msg-assistant').textContent")


@pytest.mark.parametrize("name", ["firefox", "webkit"])  # Chromium: test_site.py
def test_the_chat_page_answers_locally(smollm2, name):
    with lantern_server([smollm2], site=repo_root() / "site") as (base, seen):
        route, answer = in_browser(name, lambda browser: chat_page(browser, base))
    assert route[0] == "local" and re.fullmatch(r"local · CPU \(wasm( compat)?, \d+ threads?\)", route[1]), route
    assert answer.strip() and "[error" not in answer, answer
    assert not [p for p, _ in seen if p.startswith("/v1/")], "the answer came from the cloud"


def load_and_ask(browser, base: str, options: dict) -> tuple[dict, dict]:
    page = engine_page(browser, base)
    stats = page.evaluate("([m, o]) => load(m, o)", ["/models/smollm2/", {"device": "auto", **options}])
    [reply] = page.evaluate("(r) => chat(r)", [{**GREEDY[0], "max_tokens": 8}])
    return stats, reply


@pytest.mark.parametrize("name", ["firefox", "webkit"])
def test_without_usable_storage_the_model_loads_into_memory(server, name):
    """Each engine's own way of having no room for the model; the load goes on from the network.
    Firefox: 2 MiB of storage in all (its own preference). WebKit: MiniBrowser's own defaults, OPFS and
    the Storage API off (where wllama's cache manager stopped the load before). Chromium's quota:
    test_runtime.py."""
    base, _ = server
    options = (
        {"firefox_prefs": {"dom.quotaManager.temporaryStorage.fixedLimit": 2048}}
        if name == "firefox"
        else {"webkit_features": ""}
    )
    stats, reply = in_browser(name, lambda b: load_and_ask(b, base, {"threads": 1}), **options)
    assert reply["choices"][0]["message"]["content"].strip()
    storage = stats["storage"]
    if name == "webkit":  # without OPFS: Lantern keeps files in the Cache API, llama.cpp reads Blobs
        assert storage["backend"] == "cache-api", storage
    else:
        assert storage["backend"] == "memory" and storage["note"], storage


TIMED_LOAD = """async (o) => {
  const t = performance.now();
  const stats = await load("/models/smollm2/", o);
  return { ms: performance.now() - t, stats };
}"""


def test_firefox_tabs_share_one_engine_with_threads(server, report):
    """Firefox's SharedWorker is not cross-origin isolated: no SharedArrayBuffer, one thread for llama.cpp.
    A page that asks for the shared engine gets it in its own dedicated worker, with threads, and stats()
    says why. A second tab uses that engine (no download, no second model), and runs it itself once the
    first tab has closed (client.ts, startAcrossTabs)."""
    base, seen = server
    ask = {**GREEDY[0], "max_tokens": 8}

    def tabs(browser) -> dict:
        out: dict = {}
        a = engine_page(browser, base)
        out["a"] = a.evaluate(TIMED_LOAD, {"device": "auto", "shared": True})
        b = engine_page(browser, base)
        mark = len(seen)
        out["b"] = b.evaluate(TIMED_LOAD, {"device": "auto", "shared": True})
        out["b_fetched"] = gguf_fetches(seen, mark)
        out["answers"] = [page.evaluate("(r) => chat(r)", [ask])[0]["choices"][0]["message"]["content"] for page in (a, b)]
        a.close()
        [after] = b.evaluate("(r) => chat(r)", [ask])
        out["after"] = after["choices"][0]["message"]["content"]
        out["after_host"] = b.evaluate("() => engine.stats()")["host"]
        return out

    out = in_browser("firefox", tabs)
    stats, host = out["a"]["stats"], out["a"]["stats"]["host"]
    assert stats["wasm"]["threads"] > 1, stats["wasm"]
    assert host["kind"] == "dedicated" and "one thread" in host["fallback"], host
    second = out["b"]["stats"]["host"]
    assert (second["kind"], second["tabs"], second["models"]) == ("tab", 2, 1) and out["b_fetched"] == [], out
    report(f"wasm across tabs (Firefox): first tab's load {out['a']['ms']:.0f} ms, second tab's {out['b']['ms']:.0f} ms")
    assert out["b"]["ms"] < out["a"]["ms"] / 5, (out["a"]["ms"], out["b"]["ms"])
    assert out["answers"][0] == out["answers"][1] == out["after"], out
    assert (out["after_host"]["kind"], out["after_host"]["handovers"]) == ("dedicated", 1), out["after_host"]


def test_webkit_runs_on_the_cores_it_has_and_on_one_thread_without_shared_memory(server):
    """WebKit runs llama.cpp on several threads where SharedArrayBuffer exists (two, asked for). It
    reports navigator.hardwareConcurrency 4 on this 2-core machine: unasked, llama.cpp gets the threads
    that measurably run its way fastest, never more than there are cores (how many of them are free
    depends on what else the machine runs). Without SharedArrayBuffer it runs on exactly one, still locally."""
    base, _ = server

    def chosen_then_two(browser) -> tuple[dict, dict, dict]:
        page = engine_page(browser, base)
        chosen = page.evaluate("([m, o]) => load(m, o)", ["/models/smollm2/", {"device": "auto"}])
        page.evaluate("() => engine.unload()")
        two = page.evaluate("([m, o]) => load(m, o)", ["/models/smollm2/", {"device": "auto", "threads": 2}])
        [reply] = page.evaluate("(r) => chat(r)", [{**GREEDY[0], "max_tokens": 8}])
        return chosen, two, reply

    stats, two, reply = in_browser("webkit", chosen_then_two)
    assert two["wasm"]["threads"] == 2 and reply["choices"][0]["message"]["content"].strip(), (two, reply)
    assert stats["wasm"]["threads"] <= os.cpu_count(), stats["wasm"]
    claimed = int(re.search(r"navigator\.hardwareConcurrency is (\d+)", stats["wasm"]["threadsWhy"])[1])
    assert claimed <= 2 or "barrier rounds per ms" in stats["wasm"]["threadsWhy"], stats["wasm"]
    if claimed > 2:  # the fewest threads within 10% of the fastest rate measured (threads.ts)
        rates = [float(r) for r in stats["wasm"]["threadsWhy"].rsplit(": ", 1)[1].split(", ")]

        def first(slack: float) -> int:
            return next(i + 1 for i, r in enumerate(rates) if r >= min(0.9 * max(rates) + slack, max(rates)))

        assert first(-0.01) <= stats["wasm"]["threads"] <= first(0.01), stats["wasm"]  # rates shown to 0.01
    stats, reply = in_browser("webkit", lambda b: load_and_ask(b, base, {}), shared_memory=False)
    assert stats["device"] == "wasm" and stats["wasm"]["threads"] == 1, stats["wasm"]
    assert "SharedArrayBuffer" in stats["wasm"]["threadsWhy"], stats["wasm"]
    assert reply["choices"][0]["message"]["content"].strip()


def test_a_llama_cpp_build_that_fails_its_hash_is_an_integrity_error(smollm2):
    """The runtime's own llama.cpp build is checked like a model file: a served wllama.wasm with one byte
    changed fails the load with IntegrityError naming it, and nothing of it is cached."""
    from starlette.responses import Response

    def corrupt(app) -> None:
        @app.middleware("http")
        async def flip(request, call_next):
            if request.url.path != "/runtime/wllama.wasm":
                return await call_next(request)
            data = bytearray((repo_root() / "webruntime" / "dist" / "wllama.wasm").read_bytes())
            data[len(data) // 2] ^= 1
            return Response(bytes(data), media_type="application/wasm")

    def load(browser, base):
        page = engine_page(browser, base)
        err = page.evaluate("(m) => errorOf(() => load(m, { device: 'wasm' }))", "/models/smollm2/")
        cached = page.evaluate("async () => (await (await caches.open('lantern-artifacts-v1')).keys()).map((r) => r.url)")
        return err, cached

    with lantern_server([smollm2], customize=corrupt) as (base, _):
        err, cached = in_browser("chromium", lambda b: load(b, base))
    assert err["name"] == "IntegrityError" and "wllama.wasm" in err["message"], err
    assert not [u for u in cached if u.endswith("/runtime/wllama.wasm")], cached


def test_capability_page_names_the_build_in_every_engine(smollm2):
    def facts(browser, base):
        page = browser.new_page()
        page.goto(base + "/capability.html")
        page.wait_for("document.body.dataset.ready")
        return page.evaluate("() => document.querySelector('main').innerText")

    with lantern_server([smollm2], site=repo_root() / "site") as (base, _):
        for name in ("firefox", "webkit"):  # Chromium: test_site.py
            text = in_browser(name, lambda b: facts(b, base))
            build = "compat" if name == "webkit" else "default"
            assert re.search(rf"llama\.cpp build\s+{build} \(", text), (name, text)
            assert re.search(r"storage backends\s+Cache API", text), (name, text)
            assert "smollm2 would run locally on CPU (wasm" in text, (name, text)


def test_the_start_watchdog_arms_on_a_line_the_bundled_wllama_writes():
    """wasm.ts ends and begins again a start of llama.cpp's worker that stalls (START_STALL_S: Firefox can
    block a worker that starts workers, within 5 to 42 loads on a busy machine here, which no test can
    cause at will). It knows where a start is by that worker's console lines, so the bundled wllama must
    still write the line the watchdog arms on before emscripten creates thread workers."""
    source = (repo_root() / "webruntime" / "src" / "wasm.ts").read_text()
    pattern = re.search(r"const POOL_STARTING = /\^(.+)/;", source)[1]
    bundle = (repo_root() / "webruntime" / "dist" / "worker.js").read_text()
    said = bundle.find(pattern)
    assert said >= 0, f"the bundled wllama no longer writes {pattern!r}: update POOL_STARTING in wasm.ts"
    # in its worker's code, the line comes before the pool size it sets emscripten's thread workers by
    assert said < bundle.find("pthreadPoolSize: hasMultithread", said), "the line moved after the pool's start"
