"""Benchmark (not a test): how often the `wasm` device's load hangs in Firefox, and whether the
runtime's start watchdog (webruntime/src/wasm.ts, START_STALL_S) gets it going again.

Firefox ESR 153 now and then blocks a worker that starts workers for good; llama.cpp's threads are
workers that wllama's worker starts. It shows most on a busy machine, so --busy N processes spin
beside the browser. Each of --loads loads runs in a new page of one Firefox (the files cached after
the first), with a deadline: a load past it is a hang, and the run stops there (the page is stuck).

Prints the loads, the starts the watchdog ended and began again (stats().wasm.restarts), the hangs
against their budget (0), and the load times. Exit status 1 on a hang.

    .venv/bin/python ci/bench/bench_firefox_starts.py dist/smollm2 [--loads 100] [--busy 2] [--deadline 120]
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from bench_webgpu import bench_parser  # noqa: E402
from browser import lantern_server  # noqa: E402

from lantern.browsers import missing, open_browser  # noqa: E402


def spin() -> None:
    while True:
        pass


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--loads", type=int, default=100, help="loads, each in a new page (default 100)")
    parser.add_argument("--busy", type=int, default=2, help="processes spinning beside Firefox (default 2)")
    parser.add_argument("--deadline", type=float, default=120, help="seconds after which a load is a hang")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    args = parser.parse_args()
    why = missing("firefox")
    if why:
        print(f"firefox: {why}", file=sys.stderr)
        return 2
    art = Path(args.artifact)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    seconds: list[float] = []
    restarts = hangs = 0
    try:
        with lantern_server([art]) as (base, _), open_browser("firefox", webgpu=False, timeout=args.deadline) as browser:
            for i in range(args.loads):
                page = browser.new_page()
                page.goto(base + "/engine.html")
                page.wait_for("document.getElementById('status').textContent === 'ready'")
                start = time.perf_counter()
                try:
                    stats = page.evaluate(
                        "([m, o]) => load(m, o)", [f"/models/{art.name}/", {"device": "wasm", "threads": args.threads}]
                    )
                except TimeoutError:
                    hangs += 1
                    print(f"load {i + 1}: no answer in {args.deadline:.0f} s: a hang", file=sys.stderr)
                    break
                seconds.append(time.perf_counter() - start)
                restarts += stats["wasm"]["restarts"]
                page.evaluate("() => engine.unload()")
                print(f"load {i + 1}: {seconds[-1]:.1f} s, restarts {stats['wasm']['restarts']}", file=sys.stderr, flush=True)
    finally:
        for p in spinners:
            p.terminate()
    print(
        f"Firefox, {args.busy} processes spinning: {len(seconds) + hangs} loads, {restarts} restarted by the "
        f"watchdog, {hangs} hung (budget 0); load s median {statistics.median(seconds):.1f}, "
        f"max {max(seconds):.1f}"
        if seconds
        else "no load finished"
    )
    return 1 if hangs else 0


if __name__ == "__main__":
    sys.exit(main())
