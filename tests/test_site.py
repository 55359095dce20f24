"""The static site (site/) served by `lantern serve`, driven like a person would in headless Chromium,
and the npm packages a web app depends on."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from browser import launch, lantern_server, repo_root, wait_until_ready

pytestmark = [pytest.mark.browser, pytest.mark.webgpu_build, pytest.mark.slow]

SHOTS = repo_root() / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def smollm2(smollm2_q4, tmp_path_factory) -> Path:
    art = smollm2_q4
    link = tmp_path_factory.mktemp("served") / "smollm2"  # served as /models/smollm2/, as the embed page says
    link.symlink_to(art.path)
    return link


@pytest.fixture(scope="module")
def site(smollm2):
    with lantern_server([smollm2], site=repo_root() / "site") as (base, seen):
        wait_until_ready(base)
        yield base


def load_chat(page, base: str | None) -> None:
    """Open the chat page (``base`` None: the page already shown) and load the first model, with one
    llama.cpp thread on the CPU (the suite runs a test file per core, and llama.cpp's threads wait
    for each other at every operation: on a busy core two threads ran 5 times slower than one)."""
    if base is not None:
        page.goto(base + "/index.html?threads=1")
    page.wait_for_function("document.getElementById('model').options.length > 0")
    page.get_by_role("button", name="Load").click()
    page.wait_for_function("document.getElementById('send').disabled === false", timeout=300_000)


def ask(page, text: str) -> None:
    """Type a message and send it with Enter, as a keyboard user does."""
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")


def watch(page) -> list[str]:
    """Console errors, uncaught exceptions, failed and 4xx/5xx requests of ``page``, as they happen."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on(
        "requestfailed",
        lambda r: problems.append(f"failed: {r.url} ({r.failure})") if "net::ERR_ABORTED" not in (r.failure or "") else None,
    )  # a stopped answer aborts its stream
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    return problems


PARIS_SEEDS = range(1, 6)


def test_chat_page_loads_streams_stops_and_answers(site, playwright, report):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with launch(playwright) as browser:
        page = browser.new_page(viewport={"width": 390, "height": 844})  # a phone-sized screen
        problems = watch(page)
        load_chat(page, site)
        assert page.locator("#progress").evaluate("p => p.value") == 1
        loaded = page.locator("#progress-text").inner_text()
        assert "100%" in loaded and "smollm2-q4f32_1-00001-of-00002.gguf" in loaded, loaded
        # On SwiftShader (no GPU) the page runs the model on the CPU (llama.cpp in wasm) and says so
        assert page.locator("#route").get_attribute("data-route") == "local"
        assert page.locator("#route").inner_text() == "local · CPU (wasm, 1 thread)"
        assert not page.locator("#slow-note").is_visible()  # that note is for WebGPU on a software adapter
        # The first question a new user asks, with the artifact's sampling defaults (the page sends
        # none), over several seeds, each in a new chat
        answers = []
        for seed in PARIS_SEEDS:
            page.get_by_role("button", name="New chat").click()
            page.locator("#seed").fill(str(seed))
            ask(page, "What is the capital of France?")
            page.wait_for_function(
                "document.querySelector('.msg-assistant') && document.getElementById('send').disabled === false", timeout=300_000
            )
            answers.append(page.locator(".msg-assistant").inner_text())
        paris = sum("Paris" in a for a in answers)
        report(
            f"chat page (no GPU: CPU/wasm, artifact defaults): 'Paris' in {paris}/{len(answers)} answers "
            f"(seeds {PARIS_SEEDS.start}-{PARIS_SEEDS.stop - 1})"
        )
        assert paris >= 4, answers
        page.get_by_role("button", name="New chat").click()
        page.locator("#seed").fill("")
        sent = time.perf_counter()
        ask(page, "Count from one to twenty.")
        page.wait_for_function("document.querySelector('.msg-assistant').textContent.length > 3", timeout=300_000)
        report(f"chat page (no GPU: CPU/wasm): the first answer started {time.perf_counter() - sent:.1f} s after Send")
        page.screenshot(path=str(SHOTS / "chat-mid-answer.png"), full_page=True)
        page.get_by_role("button", name="Stop").click()
        page.wait_for_function("document.getElementById('send').disabled === false", timeout=120_000)
        assert page.locator(".msg-assistant").inner_text().endswith("[stopped]")
        # a second question still streams a full answer, with live figures
        ask(page, "What is the capital of France?")
        page.wait_for_function(
            "document.querySelectorAll('.msg-assistant').length === 2 && document.getElementById('send').disabled === false",
            timeout=300_000,
        )
        answer = page.locator(".msg-assistant").nth(1).inner_text()
        assert answer.strip() and "[error" not in answer and "[stopped]" not in answer
        assert "tok/s" in page.locator("#stats").inner_text()
        # JSON mode: the answer follows the page's schema, and the page checks it with ajv
        page.locator("#json-on").check()
        ask(page, "Describe Paris.")
        page.wait_for_selector(".json-check", timeout=300_000)
        assert page.locator(".json-check").get_attribute("data-valid") == "true"
        data = json.loads(page.locator(".msg-assistant").nth(2).inner_text())
        schema = json.loads(page.locator("#schema").input_value())
        assert set(data) == set(schema["required"])
        assert 0 <= data["population_millions"] <= 40
        assert problems == []


def test_the_chat_page_opens_and_answers_with_no_network_after_one_visit(smollm2, playwright):
    with launch(playwright) as browser:
        context = browser.new_context()
        page = context.new_page()
        with lantern_server([smollm2], site=repo_root() / "site") as (base, _):
            load_chat(page, base)  # the first visit: the service worker and the weights' cache fill
            assert page.evaluate("navigator.serviceWorker.ready.then((r) => !!r.active)")
        # The server is gone: the page, the runtime and the model index come from the service
        # worker, the manifest and weights from the runtime's cache, the answer from WebGPU.
        page.reload()
        load_chat(page, None)
        assert page.locator("#route").get_attribute("data-route") == "local"
        ask(page, "What is the capital of France?")
        page.wait_for_function("document.querySelector('.msg-assistant')?.textContent.length > 3", timeout=300_000)
        page.get_by_role("button", name="Stop").click()  # the answer is streaming locally: enough
        page.wait_for_function("document.getElementById('send').disabled === false", timeout=120_000)
        answer = page.locator(".msg-assistant").inner_text()
        assert answer.strip() and "[error" not in answer


def test_capability_page_reports_the_adapter_and_the_route(site, playwright):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with launch(playwright) as browser:
        page = browser.new_page()
        problems = watch(page)
        page.goto(site + "/capability.html")
        page.wait_for_selector("body[data-ready]")
        text = page.inner_text("main")
        assert "WebGPU\tavailable" in text and "shader-f16\tno" in text
        assert "route for smollm2\tlocal: CPU (wasm" in text and "swiftshader" in text.lower()
        assert "WebGPU device\tWebGPU (software adapter, slow)" in text
        assert re.search(r"CPU device\tCPU \(wasm, \d+ threads?\)", text)
        assert "smollm2 would run locally on CPU (wasm" in page.locator("#verdict").inner_text()
        assert problems == []
        page.screenshot(path=str(SHOTS / "capability.png"), full_page=True)


def test_without_webgpu_the_chat_page_answers_on_the_cpu(site, playwright):
    with launch(playwright, webgpu=False) as browser:
        page = browser.new_page()
        load_chat(page, site)
        assert page.locator("#route").get_attribute("data-route") == "local"
        assert page.locator("#route").inner_text().startswith("local · CPU (wasm, ")
        ask(page, "What is the capital of France?")
        page.wait_for_function(
            "document.querySelector('.msg-assistant') && document.getElementById('send').disabled === false", timeout=120_000
        )
        answer = page.locator(".msg-assistant").inner_text()
        assert answer.strip() and "[error" not in answer
        page.goto(site + "/capability.html")
        page.wait_for_selector("body[data-ready]")
        assert "route for smollm2\tlocal: CPU (wasm" in page.inner_text("main")


def test_the_embedding_example_runs_as_shown(site, playwright):
    with launch(playwright) as browser:
        page = browser.new_page()
        problems = watch(page)
        page.goto(site + "/embed.html")
        shown = page.locator("#code").inner_text()
        assert 'createEngine({ model: "/models/smollm2/" })' in shown
        page.wait_for_function("document.getElementById('embed-output').textContent !== 'loading the model…'", timeout=300_000)
        assert page.locator("#embed-output").inner_text().strip()
        # the AI SDK snippet: the real `ai` package (/runtime/ai.js) streams through Lantern's provider
        assert "streamText({ model: lantern()" in page.locator("#code-ai").inner_text()
        page.wait_for_function("document.getElementById('sdk-output').dataset.route !== undefined", timeout=300_000)
        assert page.locator("#sdk-output").inner_text().strip()
        assert page.locator("#sdk-output").get_attribute("data-route") == "local"
        assert problems == []


DOCUMENTS = {
    "Zarnia": (
        "Zarnia is a small island nation in the northern sea. Its capital is Lumen, a harbour city of "
        "forty thousand people. Most Zarnians fish or keep sheep, and the island exports wool and smoked cod."
    ),
    "Baking": (
        "Sourdough bread rises with a starter of wild yeast instead of baker's yeast. Feed the starter flour and "
        "water every day, and bake when it doubles within a few hours. A hot oven and steam give the crust."
    ),
    "Comets": (
        "A comet is a ball of ice and dust that orbits the Sun. Near the Sun its ice turns to gas, and the "
        "solar wind pushes that gas and dust into a tail that points away from the Sun."
    ),
}


def test_the_retrieval_page_answers_from_pasted_documents_with_a_citation(smollm2, minilm, tmp_path, playwright, report):
    """site/rag.html, as a person uses it, with everything local: load a chat model (SmolLM2) and an
    embedding model (all-MiniLM-L6-v2) on the CPU, in one worker, paste three documents, ask. The passage about the
    question is the nearest (real vectors), the answer cites shown passages (its grammar allows no
    other), and the documents are still there after a reload (IndexedDB)."""
    link = tmp_path / "minilm"
    link.symlink_to(minilm)
    with lantern_server([smollm2, link], site=repo_root() / "site") as (base, seen):
        with launch(playwright, webgpu=False) as browser:
            page = browser.new_page()
            problems = watch(page)
            page.goto(base + "/rag.html?threads=1")
            page.wait_for_function("document.getElementById('embed-model').options.length > 0")
            assert page.locator("#chat-model option").all_inner_texts() == ["smollm2"]
            assert page.locator("#embed-model option").all_inner_texts() == ["minilm"]
            page.get_by_role("button", name="Load").click()
            page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=300_000)
            assert page.locator("#status").get_attribute("data-models") == "2"  # both models in one worker
            for title, text in DOCUMENTS.items():
                page.locator("#doc-title").fill(title)
                page.locator("#doc-text").fill(text)
                page.get_by_role("button", name="Add document").click()
                page.wait_for_function("(t) => document.querySelector(`#docs li[data-doc='${t}']`)", arg=title)
            page.locator("#question").fill("What is the capital city of Zarnia?")
            page.get_by_role("button", name="Ask").click()
            page.wait_for_function("document.querySelector('#answer .cite')", timeout=120_000)
            nearest = page.locator("#sources li").first.get_attribute("data-doc")
            cited = [int(c) for c in page.locator("#answer .cite").evaluate_all("cs => cs.map(c => c.dataset.source)")]
            shown = page.locator("#sources li").count()
            answer = page.locator("#answer").inner_text()
            assert nearest == "Zarnia", page.locator("#sources").inner_text()
            assert shown == 3 and cited and all(1 <= n <= shown for n in cited), answer
            report(f"retrieval page: nearest passage {nearest!r}, answer {answer!r}")
            page.reload()
            page.wait_for_function("document.getElementById('embed-model').options.length > 0")
            page.get_by_role("button", name="Load").click()
            page.wait_for_function("document.getElementById('status').dataset.state === 'ready'", timeout=300_000)
            assert sorted(page.locator("#docs li").evaluate_all("ls => ls.map(l => l.dataset.doc)")) == sorted(DOCUMENTS)
            assert problems == []
    assert not any(path.startswith("/v1/") for path, _ in seen)  # nothing went to the server's API


def npm_pack(folder: Path, report) -> list[str]:
    out = subprocess.run(["npm", "pack", "--dry-run", "--json"], cwd=folder, capture_output=True, text=True, check=True)
    files = sorted(f["path"] for f in json.loads(out.stdout)[0]["files"])
    report(f"npm pack --dry-run ({folder.name}): {', '.join(files)}")
    return files


def test_npm_pack_runtime_and_artifact_hold_what_a_consumer_needs(smollm2, report):
    runtime = npm_pack(repo_root() / "webruntime", report)
    for needed in ("package.json", "dist/lantern.js", "dist/worker.js", "dist/types/index.d.ts"):
        assert needed in runtime
    assert not [f for f in runtime if f.startswith(("src/", "node_modules/")) or f.endswith(".map")]
    pkg = json.loads((repo_root() / "webruntime" / "package.json").read_text())
    assert pkg["exports"]["."]["import"] == "./dist/lantern.js" and pkg["types"] and pkg["version"]

    artifact = npm_pack(smollm2.resolve(), report)
    manifest = json.loads((smollm2 / "lantern.json").read_text())
    browser_files = {name for name in manifest["files"] if not name.endswith(".so")}
    assert browser_files | {"lantern.json"} <= set(artifact)
    assert not [f for f in artifact if f.endswith(".so")]  # the CPU library is for servers
