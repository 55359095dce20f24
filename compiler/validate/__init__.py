"""`lantern validate`: run an artifact in headless browsers with the real runtime and check it
against budgets, so a bad checkpoint fails CI like a failing test.

Browsers (--browser): Chromium (default) runs the webgpu device; Firefox and WebKitGTK, which have no
WebGPU here, run the wasm device (the GGUF on llama.cpp), where greedy tokens, speed, load times and
structured answers are measured and logits, perplexity and pipelines are not. With several browsers
each one's checks are named "<browser>:<budget key>" and its metrics are under metrics["browsers"].

Measurements (one run):
  correctness  greedy tokens from the browser vs the artifact's CPU library (match rate, first
               divergence), last-position logit error, perplexity on a held-out text; with a
               baseline report, greedy tokens and perplexity against the baseline's
  speed        load time cold (empty cache) and cached, TTFT, prefill and decode tokens/s
  size         artifact bytes, bytes each browser device downloads (webgpu, wasm), bytes per
               parameter, wasm bytes, kernels, largest WGSL kernel, peak GPU memory the runtime
               allocated
  pipelines    every kernel of every webgpu library compiled as a WebGPU pipeline (a library
               whose features the adapter lacks is "not checked", never "pass")
  structured   greedy answers under a few JSON schemas (data/schemas.json): the share
               that parse and validate (ajv, in the page)

An embedding artifact is measured on held-out texts (--texts of 4 to 48 words): the browser's vectors
against its CPU library's (lowest and mean cosine), embeddings and tokens per second, loads, size and
pipelines; its budgets are correctness.min_cosine and speed.min_embed_texts_per_s beside the loads and
sizes (a chat budget's other keys are "not checked" for it).

Exit status: 0 within budget, 1 a budget was breached, 2 the validation could not run.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import package
from ..errors import LanternError
from ..runtime.artifact import Artifact

DATA = Path(__file__).parent / "data"
PAGE = Path(__file__).parent / "page"


class CannotRun(LanternError):
    """The validation could not run (exit 2): broken artifact, no browser, no WebGPU."""


# budget key -> (metric name, "min" | "max", relative to baseline?)
BUDGETS: dict[str, tuple[str, str, bool]] = {
    "correctness.min_cpu_token_match": ("cpu_token_match", "min", False),
    "correctness.max_logit_error": ("logit_error", "max", False),
    "correctness.max_perplexity": ("perplexity", "max", False),
    "correctness.max_perplexity_increase_pct": ("perplexity", "max", True),
    "correctness.max_perplexity_gap_pct": ("perplexity_gap_pct", "max", False),
    "correctness.min_baseline_token_match": ("baseline_token_match", "min", False),
    "correctness.min_structured_valid": ("structured_valid", "min", False),
    "correctness.min_cosine": ("min_cosine", "min", False),  # an embedding model's vectors vs its CPU library's
    "speed.min_embed_texts_per_s": ("embed_texts_per_s", "min", False),
    "speed.min_decode_tokens_per_s": ("decode_tokens_per_s", "min", False),
    "speed.min_prefill_tokens_per_s": ("prefill_tokens_per_s", "min", False),
    "speed.max_ttft_s": ("ttft_s", "max", False),
    "speed.max_load_s_cold": ("load_s_cold", "max", False),
    "speed.max_load_s_cached": ("load_s_cached", "max", False),
    "speed.max_decode_drop_pct": ("decode_tokens_per_s", "drop", True),
    "size.max_artifact_bytes": ("artifact_bytes", "max", False),
    "size.max_bytes_per_param": ("bytes_per_param", "max", False),
    "size.max_peak_gpu_bytes": ("peak_gpu_bytes", "max", False),
    "size.max_wasm_bytes": ("wasm_bytes", "max", False),
    "size.max_webgpu_download_bytes": ("download_bytes_webgpu", "max", False),
    "size.max_wasm_download_bytes": ("download_bytes_wasm", "max", False),
}


@dataclass
class Check:
    name: str  # the budget key, or "pipelines:<file>"
    metric: str
    value: float | None
    limit: float | None
    status: str  # pass | fail | not-checked
    detail: str = ""


@dataclass
class ValidateOptions:
    artifact: Path
    budget: Path | None = None
    prompts: Path | None = None
    baseline: Path | None = None
    max_tokens: int = 32
    ppl_tokens: int = 256
    text: Path | None = None
    browsers: tuple[str, ...] = ("chromium",)
    threads: int | None = None  # llama.cpp's threads on the wasm device (None: the runtime's choice)
    texts: int = 32  # an embedding model's held-out texts


@dataclass
class Report:
    artifact: str
    metrics: dict
    checks: list[Check] = field(default_factory=list)
    greedy: list[dict] = field(default_factory=list)  # per prompt: browser tokens (a later baseline)
    pipelines: list[dict] = field(default_factory=list)
    structured: list[dict] = field(default_factory=list)  # per schema: the answer and what was wrong, if anything

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_json(self) -> dict:
        return {
            "artifact": self.artifact,
            "passed": self.passed,
            "metrics": self.metrics,
            "checks": [asdict(c) for c in self.checks],
            "greedy": self.greedy,
            "pipelines": self.pipelines,
            "structured": self.structured,
        }


def load_budget(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise CannotRun(f"budget {path}: {err}") from None
    flat = {
        f"{section}.{key}": value for section, table in data.items() if isinstance(table, dict) for key, value in table.items()
    }
    unknown = sorted(set(flat) - set(BUDGETS))
    if unknown:
        raise CannotRun(f"budget {path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(BUDGETS))})")
    return flat


def load_prompts(path: Path | None) -> list[dict]:
    path = path or DATA / "prompts.jsonl"
    prompts = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise CannotRun(f"{path}:{i}: not JSON ({err.msg})") from None
        if not isinstance(item, dict) or not ({"prompt", "messages"} & set(item)):
            raise CannotRun(f'{path}:{i}: each line needs "prompt" (raw text) or "messages" (chat)')
        prompts.append(item)
    if not prompts:
        raise CannotRun(f"{path}: no prompts")
    return prompts


def evaluate(metrics: dict, budget: dict[str, float], baseline: dict | None) -> list[Check]:
    checks = []
    for key, limit in sorted(budget.items()):
        metric, kind, relative = BUDGETS[key]
        value = metrics.get(metric)
        if relative:
            base = (baseline or {}).get("metrics", {}).get(metric)
            if base is None or value is None:
                checks.append(Check(key, metric, value, limit, "not-checked", "no baseline value"))
                continue
            if kind == "drop":  # percent below the baseline
                gap, where = base - value, f"below baseline {base:.4g} (limit {limit}%)"
            else:  # percent above the baseline
                gap, where = value - base, f"vs baseline {base:.4g} (limit +{limit}%)"
            change = gap / base * 100 if base else 0.0
            status = "pass" if change <= limit else "fail"
            checks.append(Check(key, metric, value, limit, status, f"{change:+.1f}% {where}"))
            continue
        if value is None:
            checks.append(Check(key, metric, None, limit, "not-checked", "not measured in this run"))
            continue
        ok = value >= limit if kind == "min" else value <= limit
        checks.append(
            Check(
                key,
                metric,
                value,
                limit,
                "pass" if ok else "fail",
                "" if ok else f"{metric} {value:.4g}, {'at least' if kind == 'min' else 'at most'} {limit:.4g} allowed",
            )
        )
    return checks


def _match(a: list[int], b: list[int]) -> tuple[int, int | None]:
    """(tokens equal position by position, first divergence or None)."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = n
    same = sum(1 for i in range(n) if a[i] == b[i])
    return same, first


def _perplexity(nll: list[float]) -> float:
    return float(math.exp(sum(nll) / len(nll)))


def check_browsers(names: tuple[str, ...]) -> None:
    """CannotRun naming what to install, before minutes of work, for any of ``names`` that cannot start."""
    from ..browsers import ENGINES, missing

    for name in names:
        if name not in ENGINES:
            raise CannotRun(f"unknown browser {name!r}: one of {', '.join(ENGINES)}, or all")
        if why := missing(name):
            raise CannotRun(f"{name} cannot run: {why}")


def measure(opts: ValidateOptions, step: Callable[[str], None]) -> Report:
    check_browsers(opts.browsers)  # before minutes of work
    try:
        art = Artifact.open(opts.artifact)
    except LanternError as err:
        raise CannotRun(str(err)) from None
    if not any(lib["target"] == "cpu" for lib in art.manifest["libraries"]):
        raise CannotRun(f"{art.path.name} has no cpu library: build it with --targets webgpu,cpu to validate")
    if art.manifest["model"].get("kind") == "embedding":
        return _measure_embedding(opts, art, step)
    prompts = load_prompts(opts.prompts)
    text = (opts.text or DATA / "heldout.txt").read_text()
    cfg = art.tokenizer_config()
    tokens = art.prompt_tokens()  # as `lantern serve` makes them: a raw prompt gets the BOS its config asks for
    tok = tokens.tokenizer
    stop_ids = [tok.token_to_id(tokens.eos)]

    def ids_of(item: dict) -> list[int]:
        if "messages" in item:
            from ..chat_template import render

            return tokens.encode(render(cfg["chat_template"], item["messages"], bos_token=tokens.bos, eos_token=tokens.eos))
        return tokens.encode(item["prompt"], raw=True)

    prompt_ids = [ids_of(p) for p in prompts]
    text_ids = tok.encode(text, add_special_tokens=False).ids[: opts.ppl_tokens]

    step("CPU reference")
    cpu = art.cpu_model()
    cpu_greedy = [cpu.greedy(p, opts.max_tokens, stop_ids) for p in prompt_ids]
    cpu.reset()
    cpu_logits = cpu.prefill(prompt_ids[0])
    cpu.reset()
    all_logits = cpu.all_logits(text_ids).astype(np.float64)
    lse = np.log(np.exp(all_logits - all_logits.max(1, keepdims=True)).sum(1)) + all_logits.max(1)
    cpu_nll = (lse[:-1] - all_logits[np.arange(len(text_ids) - 1), text_ids[1:]]).tolist()

    metrics = _size_metrics(art)
    runs = _each_browser(
        opts,
        step,
        lambda say, name, timeout: _run_browser(art, prompt_ids, text_ids, opts.max_tokens, say, name, timeout, opts.threads),
    )
    for name, data in runs.items():
        runs[name] = (data, _browser_metrics(data, prompts, text_ids, cpu_greedy, cpu_logits, cpu_nll))
    data, (first_metrics, greedy) = runs[opts.browsers[0]]
    metrics.update(first_metrics)
    if len(runs) > 1:
        metrics["browsers"] = {name: engine_metrics for name, (_, (engine_metrics, _)) in runs.items()}
    pipelines = [p for data, _ in runs.values() for p in data["pipelines"]]
    return Report(str(art.path), metrics, greedy=greedy, pipelines=pipelines, structured=data["structured"])


def _size_metrics(art: Artifact) -> dict:
    """Bytes on disk, bytes each browser device downloads, kernels and the largest WGSL kernel."""
    m = art.manifest
    webgpu = [lib for lib in m["libraries"] if lib["target"] == "webgpu"]
    return {
        "artifact_bytes": sum(f["size"] for f in m["files"].values()),
        "weight_bytes": m["weights"]["bytes"],
        "bytes_per_param": m["weights"]["bytes_per_param"],
        "wasm_bytes": sum((art.path / lib["file"]).stat().st_size for lib in webgpu),
        # what each browser device fetches: its own files only (package.device_files)
        "download_bytes_webgpu": package.download_bytes(m, "webgpu"),
        "download_bytes_wasm": package.download_bytes(m, "wasm"),
        "kernels": max((lib["kernels"] for lib in webgpu), default=0),
        "largest_kernel_bytes": max((lib["largest_kernel_bytes"] for lib in webgpu), default=0),
    }


def _each_browser(opts: ValidateOptions, step: Callable[[str], None], run: Callable) -> dict:
    """``run(say, name, timeout)`` in each browser of ``opts`` (a hung Firefox is given one more try)."""
    from ..browsers import once_more_if_firefox_hangs

    runs: dict = {}
    for name in opts.browsers:
        say = step if len(opts.browsers) == 1 else (lambda s, n=name: step(f"{n}: {s}"))  # type: ignore[misc]  # mypy#15459
        timeout = FIREFOX_HANG_S if name == "firefox" else 600
        runs[name] = once_more_if_firefox_hangs(name, lambda: run(say, name, timeout), FIREFOX_HANG_S, say)  # noqa: B023 (run now)
    return runs


def held_out_texts(text: str, count: int) -> list[str]:
    """``count`` texts of 4 to 48 words, cut one after another from ``text`` (from its start again if it runs out)."""
    words = text.split()
    if not words:
        raise CannotRun("the held-out text is empty")
    sizes = np.random.default_rng(0).integers(4, 49, size=count)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [" ".join(words[(int(at) + i) % len(words)] for i in range(int(n))) for at, n in zip(starts, sizes)]


def _measure_embedding(opts: ValidateOptions, art: Artifact, step: Callable[[str], None]) -> Report:
    """An embedding model: each browser's vectors of held-out texts against the CPU library's."""
    from ..server.embeddings import Embedder

    if opts.texts < 1:
        raise CannotRun(f"--texts must be at least 1, got {opts.texts}")
    texts = held_out_texts((opts.text or DATA / "heldout.txt").read_text(), opts.texts)
    step("CPU reference")
    embedder = Embedder(art.path, "tvm")
    try:
        tokens = embedder.tokens(texts, truncate=True)
        reference = embedder.embed(tokens)
    finally:
        embedder.close()
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    metrics = _size_metrics(art)
    runs = _each_browser(opts, step, lambda say, name, timeout: _run_embedding(art, texts, say, name, timeout, opts.threads))
    per_browser = {}
    for name, data in runs.items():
        vectors = np.asarray(data.pop("vectors"), dtype=np.float64)
        cos = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True) * reference).sum(1)
        per_browser[name] = {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()), **data["metrics"]}
    metrics.update(per_browser[opts.browsers[0]])
    if len(runs) > 1:
        metrics["browsers"] = per_browser
    pipelines = [p for data in runs.values() for p in data["pipelines"]]
    return Report(str(art.path), metrics, pipelines=pipelines)


def _browser_metrics(
    data: dict,
    prompts: list[dict],
    text_ids: list[int],
    cpu_greedy: list[list[int]],
    cpu_logits: np.ndarray,
    cpu_nll: list[float],
) -> tuple[dict, list[dict]]:
    """One browser's metrics against the CPU library, and its greedy tokens per prompt."""
    same = total = 0
    first_divergence = []
    greedy = []
    for p, cpu_ids, web_ids in zip(prompts, cpu_greedy, data["greedy"]):
        s, first = _match(web_ids, cpu_ids)
        same += s
        total += max(len(web_ids), len(cpu_ids), 1)
        first_divergence.append(first)
        greedy.append({"prompt": p, "tokens": web_ids, "cpu_tokens": cpu_ids, "first_divergence": first})
    metrics = {
        "cpu_token_match": same / total,
        "first_divergence": min((f for f in first_divergence if f is not None), default=None),
    }
    if data.get("logits") is not None:  # the webgpu device; the wasm device has no logits to compare
        web_logits = np.asarray(data["logits"], dtype=np.float64)
        perplexity, cpu_perplexity = _perplexity(data["nll"]), _perplexity(cpu_nll)
        metrics.update(
            {
                "logit_error": float(np.abs(web_logits - cpu_logits).max() / np.abs(cpu_logits).max()),
                "perplexity": perplexity,
                "cpu_perplexity": cpu_perplexity,
                "perplexity_gap_pct": abs(perplexity / cpu_perplexity - 1) * 100,
                "perplexity_tokens": len(text_ids),
            }
        )
    metrics.update(data["metrics"])
    return metrics, greedy


# A Firefox run with no answer in FIREFOX_HANG_S is given up and run once more in a fresh browser
# (lantern.browsers.once_more_if_firefox_hangs): the browser's fault, not the artifact's. The longest
# call, a structured answer on a busy machine, takes about 60 s.
FIREFOX_HANG_S = 180


def _run_browser(
    art: Artifact,
    prompt_ids: list[list[int]],
    text_ids: list[int],
    max_tokens: int,
    step: Callable[[str], None],
    name: str = "chromium",
    timeout: float = 600,
    threads: int | None = None,
) -> dict:
    """The browser-side measurements in ``name``: Chromium on the webgpu device; an engine without
    WebGPU here (Firefox, WebKitGTK) on the wasm device, which measures no logits, perplexity or pipelines."""
    device = "webgpu" if name == "chromium" else "wasm"
    model_url = f"/models/{art.path.name}/"
    out: dict = {"metrics": {}, "pipelines": [], "logits": None, "nll": None}
    with _validate_page(art, name, timeout) as session:
        call = session.call

        step("browser: cold load")
        call("(m) => lanternValidate.clearCache(m)", model_url)
        cold = call("([m, d, t]) => lanternValidate.load(m, d, t)", [model_url, device, threads])
        out["metrics"].update(
            load_s_cold=cold["seconds"],
            peak_gpu_bytes=cold["stats"]["peakGpuBytes"],
            library=cold["stats"]["library"],
            adapter=cold["stats"]["adapter"],
            device=cold["stats"]["deviceLabel"],
        )
        step("browser: greedy continuations")
        runs = [
            call("(r) => lanternValidate.debug(r)", {"op": "greedy", "prompt": ids, "maxTokens": max_tokens})
            for ids in prompt_ids
        ]
        out["greedy"] = [r["tokens"] for r in runs]
        # speed from the same runs: prefill of each prompt, then one decode step per token
        prefill_s = sum(r["prefillMs"] for r in runs) / 1000
        decode_s = sum(r["decodeMs"] for r in runs) / 1000
        steps = sum(r["decodeSteps"] for r in runs)
        out["metrics"].update(
            ttft_s=prefill_s / len(runs),
            prefill_tokens_per_s=sum(map(len, prompt_ids)) / prefill_s,
            decode_tokens_per_s=steps / decode_s if decode_s else None,
        )
        if device == "webgpu":
            out["logits"] = call("(r) => lanternValidate.debug(r)", {"op": "logits", "tokens": prompt_ids[0]})["logits"]
            step("browser: perplexity")
            out["nll"] = call("(r) => lanternValidate.debug(r)", {"op": "nll", "tokens": text_ids})["nll"]
        step("browser: structured output")
        out["structured"] = _structured(call)
        out["metrics"]["structured_valid"] = sum(r["problem"] is None for r in out["structured"]) / len(out["structured"])
        out["metrics"]["peak_gpu_bytes"] = call("() => lanternValidate.stats()")["peakGpuBytes"]
        call("() => lanternValidate.unload()")
        step("browser: cached load")
        session.reopen()  # a second visit: weights from the cache
        cached = call("([m, d, t]) => lanternValidate.load(m, d, t)", [model_url, device, threads])
        out["metrics"]["load_s_cached"] = cached["seconds"]
        call("() => lanternValidate.unload()")
        if device == "webgpu":
            step("browser: pipelines")
            out["pipelines"] = _pipelines(art, call)
    return out


class _Session:
    """The validate page in a browser: ``call`` evaluates in it, ``reopen`` visits it again."""

    def __init__(self, browser, base: str, name: str):
        self.browser, self.base, self.name = browser, base, name
        self.reopen()

    def reopen(self) -> None:
        self.page = self.browser.new_page()
        self.page.goto(self.base + "/index.html")
        self.page.wait_for("document.getElementById('status').textContent === 'ready'")

    def call(self, expr: str, arg=None):
        from ..browsers import BrowserError

        try:
            return self.page.evaluate(expr, arg)
        except BrowserError as err:  # the page's error, e.g. WebGPUUnavailableError
            raise CannotRun(f"the {self.name} run failed: {err}") from None


@contextlib.contextmanager
def _validate_page(art: Artifact, name: str, timeout: float):
    """The artifact and the validate page served on a free port (no API), open in browser ``name``."""
    from ..browsers import open_browser
    from ..server.app import create_app
    from ..server.background import serve_in_thread
    from ..server.config import ServerConfig

    app = create_app(ServerConfig([art.path], site=PAGE, api=False))
    with serve_in_thread(app) as base, open_browser(name, timeout=timeout) as browser:
        yield _Session(browser, base, name)


def _pipelines(art: Artifact, call: Callable) -> list[dict]:
    """Every webgpu library's kernels compiled as WebGPU pipelines on the page's adapter."""
    return [
        call(
            "([m, f, r]) => lanternValidate.pipelines(m, f, r)",
            [f"/models/{art.path.name}/", lib["file"], lib["required_features"]],
        )
        for lib in art.manifest["libraries"]
        if lib["target"] == "webgpu"
    ]


def _run_embedding(
    art: Artifact, texts: list[str], step: Callable[[str], None], name: str, timeout: float, threads: int | None
) -> dict:
    """An embedding model in browser ``name`` (Chromium: webgpu; the others: wasm): loads cold and cached,
    the vectors of ``texts`` in one call, its speed, and (webgpu) the pipelines."""
    device = "webgpu" if name == "chromium" else "wasm"
    model_url = f"/models/{art.path.name}/"
    with _validate_page(art, name, timeout) as session:
        call = session.call
        step("browser: cold load")
        call("(m) => lanternValidate.clearCache(m)", model_url)
        cold = call("([m, d, t]) => lanternValidate.load(m, d, t)", [model_url, device, threads])
        step(f"browser: {len(texts)} texts")
        got = call("(req) => lanternValidate.embed(req)", {"input": texts})
        stats = call("() => lanternValidate.stats()")
        call("() => lanternValidate.unload()")
        step("browser: cached load")
        session.reopen()
        cached = call("([m, d, t]) => lanternValidate.load(m, d, t)", [model_url, device, threads])
        call("() => lanternValidate.unload()")
        pipelines = []
        if device == "webgpu":
            step("browser: pipelines")
            pipelines = _pipelines(art, call)
    return {
        "vectors": got["vectors"],
        "pipelines": pipelines,
        "metrics": {
            "embed_texts_per_s": len(texts) / got["seconds"],
            "embed_tokens_per_s": got["tokens"] / got["seconds"],
            "load_s_cold": cold["seconds"],
            "load_s_cached": cached["seconds"],
            "peak_gpu_bytes": stats["peakGpuBytes"],
            "library": cold["stats"]["library"],
            "adapter": cold["stats"]["adapter"],
            "device": cold["stats"]["deviceLabel"],
        },
    }


def _structured(call) -> list[dict]:
    """Greedy answers under each schema of data/schemas.json, checked with ajv in the page."""
    spec = json.loads((DATA / "schemas.json").read_text())
    out = []
    for name, schema in spec["schemas"].items():
        try:
            reply = call(
                "(r) => lanternValidate.chat(r)",
                {
                    "messages": spec["messages"],
                    "max_tokens": spec["max_tokens"],
                    "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
                },
            )
        except CannotRun as err:  # a generation that fails is this artifact's failure, not the run's
            out.append({"schema": name, "text": None, "problem": str(err)})
            continue
        text = reply["choices"][0]["message"]["content"]
        out.append({"schema": name, "text": text, "problem": call("([s, t]) => lanternValidate.checkJson(s, t)", [schema, text])})
    return out


def pipeline_checks(report: Report) -> list[Check]:
    checks = []
    for p in report.pipelines:
        if not p["checked"]:
            status, detail = "not-checked", f"adapter lacks {', '.join(p['missingFeatures'])}"
        else:
            status = "pass" if p["ok"] else "fail"
            detail = f"{p['kernels']} kernels compiled in {p['seconds']:.1f} s" if p["ok"] else p.get("error", "")
        checks.append(Check(f"pipelines:{p['file']}", "pipelines", p["kernels"], None, status, detail))
    return checks


def write_junit(report: Report, path: Path) -> None:
    suite = ET.Element(
        "testsuite",
        name="lantern validate",
        tests=str(len(report.checks)),
        failures=str(sum(c.status == "fail" for c in report.checks)),
        skipped=str(sum(c.status == "not-checked" for c in report.checks)),
    )
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname="lantern.validate", name=c.name)
        if c.status == "fail":
            ET.SubElement(case, "failure", message=c.detail or c.name)
        elif c.status == "not-checked":
            ET.SubElement(case, "skipped", message=c.detail)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def validate(opts: ValidateOptions, step: Callable[[str], None] = lambda _: None) -> Report:
    budget = load_budget(opts.budget)
    baseline = None
    if opts.baseline is not None:
        try:
            baseline = json.loads(opts.baseline.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CannotRun(f"baseline {opts.baseline}: {err}") from None
    started = time.perf_counter()
    report = measure(opts, step)
    if baseline is not None:
        matched = total = 0
        for mine, theirs in zip(report.greedy, baseline.get("greedy", [])):
            s, _ = _match(mine["tokens"], theirs["tokens"])
            matched += s
            total += max(len(mine["tokens"]), len(theirs["tokens"]), 1)
        report.metrics["baseline_token_match"] = matched / total if total else None
    report.metrics["validate_seconds"] = time.perf_counter() - started
    if "browsers" in report.metrics:  # each browser against the budget, its checks named for it
        checks = []
        for name, engine_metrics in report.metrics["browsers"].items():
            for c in evaluate({**report.metrics, **engine_metrics}, budget, baseline):
                c.name = f"{name}:{c.name}"
                checks.append(c)
        report.checks = checks + pipeline_checks(report)
    else:
        report.checks = evaluate(report.metrics, budget, baseline) + pipeline_checks(report)
    return report
