"""The ``lantern`` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Iterator

from . import __version__, models
from .errors import LanternError
from .importer import BUNDLED, GGUF_INPUT_TYPES
from .lower import SCHEDULE_CHOICES
from .package import DEFAULT_CONTEXT, GENERATION_FIELDS, check_generation_defaults
from .quantize import QUANTIZATIONS

BUILD_EXAMPLES = (
    """examples:
  lantern build smollm2 --out dist/smollm2                              bundled SmolLM2-135M-Instruct
  lantern build gemma3-270m --out dist/gemma3                           bundled Gemma 3 270M (base)
  lantern build ./my-finetune --quant q4f32_1 --out dist/my-model       Hugging Face folder
  lantern build model.gguf --quant q4f16_1 --out dist/m                 GGUF file
  lantern build ./base --lora ./adapter --quant q4f16_1 --out dist/m    PEFT LoRA merged at build
  lantern build ./my-finetune --calibration train-sample.txt --out dist/m  GPTQ on your own text

model families (config.json "architectures" / GGUF general.architecture):
"""
    + "".join(f"  {f.name:8} {', '.join(f.architectures)} / {f.gguf.architecture}\n" for f in models.FAMILIES)
    + f"""
GGUF tensor types read (dequantized, then quantized by Lantern): {", ".join(GGUF_INPUT_TYPES)}
"""
)


def _generation_arg(name: str):
    """argparse type of a sampling-default flag: a number within package.GENERATION_FIELDS' range."""

    def parse(text: str):
        try:
            value = int(text) if name == "top_k" else float(text)
            return check_generation_defaults({name: value}, name)[name]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{'an integer' if name == 'top_k' else 'a number'} expected, got {text!r}"
            ) from None
        except LanternError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None

    return parse


class RichReporter:
    """Draws one progress bar per stage on stderr."""

    def __init__(self, console):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[stage]:<9}"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = None

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[None]:
        self.task = self.progress.add_task(name, total=total, stage=name, detail="")
        try:
            yield
            self.progress.update(self.task, completed=total or 1, total=total or 1)
        finally:
            self.task = None

    def advance(self, step: int = 1, detail: str = "") -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=step, detail=detail)

    def log(self, message: str) -> None:
        self.progress.console.log(message)


class LineReporter:
    """Plain lines for logs (stderr is not a terminal: CI, nohup, a pipe): one when a stage starts, one
    when it ends with its time, and the current step at most every ``every`` seconds in between."""

    total: int | None  # the current stage's steps, if known

    def __init__(self, command: str, every: float = 5.0, out=None):
        self.prefix, self.every, self.out = f"lantern {command}:", every, out or sys.stderr
        self.name, self.total, self.done, self.started, self.said = "", None, 0, 0.0, 0.0

    def _say(self, text: str) -> None:
        print(f"{self.prefix} {text}", file=self.out, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[None]:
        self.name, self.total, self.done = name, total, 0
        self.started = self.said = time.monotonic()
        self._say(f"{name} started")
        try:
            yield
        except BaseException:
            self._say(f"{name} stopped after {time.monotonic() - self.started:.1f} s")
            raise
        self._say(f"{name} done in {time.monotonic() - self.started:.1f} s")

    def advance(self, step: int = 1, detail: str = "") -> None:
        self.done += step
        now = time.monotonic()
        if now - self.said >= self.every:
            self.said = now
            count = f"{self.done}/{self.total} " if self.total else ""
            self._say(f"{self.name} {count}{detail} ({now - self.started:.0f} s)")

    def log(self, message: str) -> None:
        self._say(message)


def _summary_table(result) -> "object":
    from rich.table import Table

    from . import package

    m = result.manifest
    table = Table(title=f"{m['model']['name']} ({m['quantization']}) -> {result.out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("weights", f"{m['weights']['bytes'] / 2**20:.1f} MiB in {m['weights']['shards']} shards")
    table.add_row("bytes/param", f"{m['weights']['bytes_per_param']:.3f}")
    table.add_row("parameters", f"{m['model']['parameters']:,}")
    if m.get("embedding"):
        table.add_row("embedding", package.embedding_summary(m))
    else:
        table.add_row("4-bit encoder", package.encoder_summary(m))
        table.add_row("sampling defaults", package.generation_summary(m))
    table.add_row("est. GPU memory", f"{m['memory']['estimated_gpu_bytes'] / 2**20:.0f} MiB")
    for lib in m["libraries"]:
        size = m["files"][lib["file"]]["size"]
        table.add_row(lib["file"], f"{size / 2**20:.1f} MiB, {lib['kernels']} kernels")
    if m.get("gguf"):
        g = m["gguf"]
        table.add_row("GGUF (llama.cpp)", f"{g['bytes'] / 2**20:.1f} MiB {g['tensor_type']} in {len(g['files'])} part(s)")
    if m.get("draft"):
        d = m["draft"]
        table.add_row("draft model (GGUF)", f"{d['bytes'] / 2**20:.1f} MiB, {d['source']}")
    for stage, seconds in result.stage_seconds.items():
        peak = result.stage_peak_bytes.get(stage)
        table.add_row(f"time: {stage}", f"{seconds:.1f} s" + (f", peak RSS {peak / 2**30:.2f} GiB" if peak else ""))
    if result.cached:
        table.add_row("cache", "hit (nothing rebuilt)")
    elif result.reused_libraries:
        table.add_row("cache", f"libraries reused (same architecture): {', '.join(result.reused_libraries)}")
    return table


def cmd_build(args) -> int:
    from rich.console import Console

    from .gptq import DEFAULT_CALIBRATION
    from .pipeline import BuildOptions, Reporter, build

    console = Console(stderr=True)
    opts = BuildOptions(
        source=args.source,
        out=Path(args.out),
        quant=args.quant,
        lora=Path(args.lora) if args.lora else None,
        draft=args.draft,
        calibration=None if args.no_calibration else Path(args.calibration) if args.calibration else DEFAULT_CALIBRATION,
        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()) if args.targets else (),
        webgpu_schedule=args.webgpu_schedule,
        context_window=args.context_window,
        generation={k: v for k in ("temperature", "top_p", "top_k", "repetition_penalty") if (v := getattr(args, k)) is not None},
        dump_dir=Path(args.dump_dir) if args.dump_dir else None,
        name=args.name,
        use_cache=not args.no_cache,
    )
    if args.cache_dir:
        opts.cache_dir = Path(args.cache_dir)
    if args.json:
        result = build(opts, Reporter())
    elif not console.is_terminal:  # a log: bars would show only at the end
        result = build(opts, LineReporter("build"))
        console.print(_summary_table(result))
    else:
        reporter = RichReporter(console)
        with reporter.progress:
            try:
                result = build(opts, reporter)
            except BaseException:
                # A failed build ends in one error line: drop the bars drawn so far.
                for task in list(reporter.progress.task_ids):
                    reporter.progress.remove_task(task)
                raise
        console.print(_summary_table(result))
    if args.json:
        print(
            json.dumps(
                {
                    "out": str(result.out),
                    "cached": result.cached,
                    "reused_libraries": result.reused_libraries,
                    "stage_seconds": result.stage_seconds,
                    "stage_peak_bytes": result.stage_peak_bytes,
                    "manifest": result.manifest,
                },
                indent=2,
            )
        )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from .server.app import create_app
    from .server.config import Limits, ServerConfig
    from .server.background import serve_until_signal

    _at_least_one("--parallel", args.parallel)
    _at_least_one("--threads", args.threads)
    for flag, value in (("--request-timeout", args.request_timeout), ("--shutdown-timeout", args.shutdown_timeout)):
        if not value >= 0 or value == float("inf"):
            raise LanternError(f"{flag} must be a number of seconds, 0 or more (got {value})")
    api_key = args.api_key or os.environ.get("LANTERN_API_KEY")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        raise LanternError(f"binding to {args.host} exposes the API beyond this machine: set --api-key or LANTERN_API_KEY")
    config = ServerConfig(
        [Path(d) for d in args.dirs],
        Path(args.site) if args.site else None,
        api_key=api_key,
        cors_origins=[o.strip() for o in (args.cors or "").split(",") if o.strip()],
        limits=Limits(max_tokens=args.max_tokens, max_queue=args.max_queue, request_timeout_s=args.request_timeout or None),
        engine=args.engine,
        parallel=args.parallel,
        threads=args.threads,
        log=lambda line: print(f"lantern serve: {line}", file=sys.stderr, flush=True),
    )
    app = create_app(config)
    names = ", ".join(f"/models/{Path(d).resolve().name}/" for d in args.dirs)
    print(
        f"lantern: serving {names}, the runtime, the site and the OpenAI API (/v1) on http://{args.host}:{args.port}/",
        file=sys.stderr,
    )
    serve_until_signal(app, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout)
    return 0


def _report_table(report):
    from rich.table import Table

    table = Table(title=f"lantern validate {report.artifact}")
    for col in ("check", "value", "limit", "result", "detail"):
        table.add_column(col)
    style = {"pass": "green", "fail": "bold red", "not-checked": "yellow"}
    for c in report.checks:
        value = "" if c.value is None else f"{c.value:.4g}"
        limit = "" if c.limit is None else f"{c.limit:.4g}"
        table.add_row(c.name, value, limit, f"[{style[c.status]}]{c.status}[/]", c.detail)
    return table


def _metrics_table(report):
    from rich.table import Table

    table = Table(title="measured")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def rows(metrics: dict, prefix: str = "") -> None:
        for k, v in metrics.items():
            if isinstance(v, dict) and k == "browsers":
                for name, engine_metrics in v.items():
                    rows(engine_metrics, f"{name}.")
            else:
                table.add_row(prefix + k, f"{v:.4g}" if isinstance(v, float) else str(v))

    rows(report.metrics)
    return table


def _browsers(arg: str) -> tuple[str, ...]:
    """--browser's value: a comma-separated list of engines, or all."""
    from .browsers import ENGINES

    names = ENGINES if arg == "all" else tuple(n.strip() for n in arg.split(",") if n.strip())
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise LanternError(f"--browser takes {', '.join(ENGINES)} (comma-separated) or all; got {arg!r}")
    return names


def _at_least_one(flag: str, value: int | None) -> None:
    """A count option (None: not given) below 1: LanternError naming it."""
    if value is not None and value < 1:
        raise LanternError(f"{flag} must be at least 1 (got {value})")


def cmd_validate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .validate import CannotRun, ValidateOptions, validate, write_junit

    _at_least_one("--threads", args.threads)
    _at_least_one("--texts", args.texts)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    opts = ValidateOptions(
        artifact=Path(args.artifact),
        budget=Path(args.budget) if args.budget else None,
        prompts=Path(args.prompts) if args.prompts else None,
        baseline=Path(args.baseline) if args.baseline else None,
        max_tokens=args.max_tokens,
        ppl_tokens=args.ppl_tokens,
        text=Path(args.text) if args.text else None,
        browsers=_browsers(args.browser),
        threads=args.threads,
        texts=args.texts,
    )
    try:
        if console.is_terminal:
            with console.status("validating") as status:
                report = validate(opts, lambda s: status.update(f"validate: {s}"))
        else:  # a log: one line per step, with the time so far
            lines = LineReporter("validate")
            started = time.monotonic()
            report = validate(opts, lambda s: lines.log(f"{s} ({time.monotonic() - started:.0f} s)"))
    except CannotRun as err:
        print(f"lantern: validate could not run: {err}", file=sys.stderr)
        return 2
    console.print(_metrics_table(report))
    console.print(_report_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if args.junit:
        write_junit(report, Path(args.junit))
    failed = [c.name for c in report.checks if c.status == "fail"]
    if failed:
        print(f"lantern: validate: budget breached: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("lantern: validate: within budget", file=sys.stderr)
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lantern",
        description="Compile language models into browser artifacts: WebGPU kernels in a wasm library, "
        "quantized weights and a hash manifest.",
    )
    parser.add_argument("--version", action="version", version=f"lantern {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "build",
        help="convert, quantize and compile a model into a browser artifact",
        description="Convert, quantize and compile a model into a folder that any static host can serve "
        "and `npm publish` accepts (WebGPU wasm libraries, CPU library, weights, a GGUF for llama.cpp, "
        "manifest).",
        epilog=BUILD_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "source",
        help=f"a Hugging Face folder, a .gguf file (of a split GGUF: its first part), or a bundled name ({', '.join(BUNDLED)})",
    )
    b.add_argument("--out", required=True, help="artifact folder to create (replaced atomically)")
    b.add_argument(
        "--quant",
        default=None,
        choices=list(QUANTIZATIONS),
        help="weight format (default: q4f32_1 for chat models, which runs on every WebGPU adapter; "
        "q0f16 for embedding models, which are built q0f32 or q0f16)",
    )
    b.add_argument("--lora", help="PEFT LoRA adapter folder to merge into the base weights")
    b.add_argument(
        "--draft",
        metavar="QUANT_OR_GGUF",
        help="a draft model for speculative decoding on `lantern serve`'s llamacpp engine, packed as a GGUF "
        "next to the model's: a quantization of this model (e.g. q4f32_1 for an unquantized or 8-bit "
        "build; rounded to nearest), or a .gguf file of a small model with the same vocabulary. "
        "Needs the gguf target",
    )
    calib = b.add_mutually_exclusive_group()
    calib.add_argument(
        "--calibration",
        metavar="TEXT_FILE",
        help="UTF-8 text that 4-bit builds calibrate on (GPTQ; the first 4096 tokens are used). "
        "Text like what your users will send gives the best model: for a fine-tune, a "
        "sample of its training data. Default: a built-in mix of English prose, chat, "
        "code and lists",
    )
    calib.add_argument(
        "--no-calibration",
        action="store_true",
        help="round every weight to its nearest 4-bit level instead of GPTQ (faster build, less accurate model)",
    )
    b.add_argument(
        "--targets",
        default=None,
        help="comma-separated outputs: webgpu (the WebGPU libraries), cpu (the CPU library), gguf "
        "(the same weights as a GGUF for llama.cpp: the browser's wasm device, split into parts), wasm "
        "(an embedding model's CPU library compiled to wasm: the browser's wasm device runs it instead of "
        "the GGUF) (default: webgpu,cpu,gguf, and wasm too for BERT encoders; a model llama.cpp cannot run "
        "skips gguf with a warning)",
    )
    b.add_argument(
        "--webgpu-schedule",
        default="both",
        choices=SCHEDULE_CHOICES,
        help="kernel schedule of the webgpu libraries: gpu (for real GPUs), cpu-emulated (for "
        "software adapters such as SwiftShader, WARP, lavapipe: no GPU in the machine) or both "
        "(default): one library each, sharing the weights; the runtime picks by adapter",
    )
    b.add_argument(
        "--context-window",
        type=int,
        metavar="TOKENS",
        help="tokens of context (prompt + answer) the runtimes allocate KV-cache memory for (default: "
        f"{DEFAULT_CONTEXT}, or the model's trained length if shorter). Sliding windows (Mistral, "
        "Phi-3, Gemma) hold at any length in the float32 CPU and cpu-emulated libraries; float16 "
        "and gpu-schedule libraries of those stop at the window",
    )
    gen = b.add_argument_group(
        "sampling defaults",
        "What both runtimes (and WebLLM) use when a request omits the field: a request's value wins, then these, "
        "then OpenAI's defaults. Unset flags come from the HF folder's generation_config.json (the bundled "
        "smollm2: temperature 0.2, top_p 0.9).",
    )
    for name, metavar, meaning in (
        ("temperature", "T", "0: greedy"),
        ("top_p", "P", "1: off"),
        ("top_k", "K", "an integer, 0: off"),
        ("repetition_penalty", "R", "1: off"),
    ):
        _, lo, hi = GENERATION_FIELDS[name]
        gen.add_argument(
            f"--{name.replace('_', '-')}",
            type=_generation_arg(name),
            metavar=metavar,
            help=f"{lo:g} to {hi:g} ({meaning})" if hi is not None else f">= {lo:g} ({meaning})",
        )
    b.add_argument("--name", help="model name used in file names and package.json (default: from source)")
    b.add_argument("--dump-dir", help="write the IR after every compiler phase to this folder")
    b.add_argument("--cache-dir", help="build cache folder (default: $LANTERN_CACHE or ~/.cache/lantern)")
    b.add_argument("--no-cache", action="store_true", help="rebuild even if an identical build is cached")
    b.add_argument("--json", action="store_true", help="print a machine-readable result instead of tables")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser(
        "serve",
        help="OpenAI-compatible API on the CPU, plus the site, runtime and artifacts over HTTP",
        description="Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models) running "
        "each artifact on the CPU, /health and /metrics, and as static files the site at /, the "
        "runtime at /runtime/lantern.js and /runtime/worker.js, and each artifact folder at "
        "/models/<folder name>/ (the model's name in the API).",
    )
    s.add_argument("dirs", nargs="+", metavar="DIR", help="artifact folders built by `lantern build`")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    s.add_argument(
        "--site", help="folder served at / (default: Lantern's own site: the chat demo, capability page and embedding example)"
    )
    s.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on /v1 (default: $LANTERN_API_KEY); "
        "needed for any bind address other than loopback",
    )
    s.add_argument("--cors", help="comma-separated origins allowed to call the API from a browser")
    s.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens a request may ask (default 4096)")
    s.add_argument(
        "--max-queue", type=int, default=16, help="requests that may wait per model before new ones get HTTP 429 (default 16)"
    )
    s.add_argument(
        "--engine",
        choices=("auto", "llamacpp", "tvm"),
        default="auto",
        help="llamacpp: the artifact's GGUF on llama.cpp, several requests decoded together, shared "
        "prompt prefixes reused (needs the llamacpp extra); tvm: the artifact's CPU library, one "
        "request at a time (the reference). auto (default): llamacpp when the artifact has a GGUF "
        "and llama-cpp-python is installed, else tvm; the log says which runs and why",
    )
    s.add_argument("--parallel", type=int, default=8, help="llamacpp engine: sequences decoded together per model (default 8)")
    s.add_argument("--threads", type=int, help="llamacpp engine: CPU threads (default: all cores)")
    s.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a request's deadline unless it sends its own `timeout` field, its wait in the queue "
        "included: past it the request ends with HTTP 504, or in a stream with finish_reason "
        '"timeout" and an error event (default 600; 0: none)',
    )
    s.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, stop taking requests and give the running ones this long to "
        "finish before they are cancelled; requests whose clients left stop at once (default 10)",
    )
    s.set_defaults(func=cmd_serve)

    v = sub.add_parser(
        "validate",
        help="run an artifact in headless browsers and check it against budgets (exit 0/1/2)",
        description="Load the artifact with the real runtime (Web Worker, WebGPU) in headless Chromium and "
        "measure correctness against its CPU library (greedy tokens, logits, perplexity), speed "
        "(load cold and cached, TTFT, prefill and decode tokens/s), size and GPU memory, and that "
        "every kernel compiles as a WebGPU pipeline. In Firefox and WebKitGTK (--browser), which "
        "have no WebGPU here, the GGUF runs on the wasm device: greedy tokens, speed, loads and "
        "structured answers. An embedding model's vectors of held-out texts are compared with its CPU "
        "library's (cosine), with embeddings/s, loads and sizes. Exit 0 within budget, 1 a budget was "
        "breached, 2 the validation could not run. Budget file format: see ci/budget.toml.",
    )
    v.add_argument("artifact", help="artifact folder built by `lantern build` (with the cpu target)")
    v.add_argument("--budget", help="TOML file of limits (absolute, or relative to --baseline)")
    v.add_argument(
        "--prompts", help='JSONL prompts: {"prompt": "raw text"} or {"messages": [...]} per line (default: five built-in prompts)'
    )
    v.add_argument("--baseline", help="an earlier --json report; relative budgets and token matches use it")
    v.add_argument("--json", help="write the full report (metrics, checks, greedy tokens) here")
    v.add_argument("--junit", help="write the checks as JUnit XML here")
    v.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    v.add_argument("--ppl-tokens", type=int, default=256, help="held-out text tokens for perplexity (default 256)")
    v.add_argument(
        "--text", help="held-out text file for perplexity, or an embedding model's texts (default: a built-in passage)"
    )
    v.add_argument(
        "--texts",
        type=int,
        default=32,
        help="an embedding model's held-out texts (4 to 48 words, cut from --text), embedded in one call (default 32)",
    )
    v.add_argument(
        "--browser",
        default="chromium",
        metavar="NAMES",
        help="browser engines to run in: chromium, firefox, webkit (comma-separated), or all; each "
        "must be installed (Debian: chromium, firefox-esr, webkit2gtk-driver and xvfb). "
        "Checks are then named <browser>:<budget key> (default: chromium)",
    )
    v.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="llama.cpp threads on the wasm device (the browsers without WebGPU here) (default: the "
        "runtime's choice, as a page gets it)",
    )
    v.set_defaults(func=cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except LanternError as err:
        print(f"lantern: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lantern: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
