"""Benchmark (not a test): `lantern serve` under concurrent clients that leave, time out and retry.

Starts `lantern serve` on an artifact (loopback only), once per engine, and runs N concurrent clients
for a fixed time at each load level. Every client sends requests one after another from a mix:

    short   a one-line question                        max_tokens 64
    long    ~600 prompt tokens of prose to summarize    max_tokens 64
    json    response_format json_schema (an object)     max_tokens 96
    tools   a required tool call                        max_tokens 64

half of them streamed. With faults on (the default), 20% of the requests are abandoned at a random
point (the client closes its socket 0.1-4 s after sending) and 10% time out: the client gives up
after --client-timeout seconds and sends that as the request's `timeout` (a server without deadlines
ignores the field). A client answered 429 waits its Retry-After (at most 5 s; 1 s without one).

Printed per engine and load: requests, completed, 429 and 504 rates, other 5xx, client errors,
delivered tokens per second, TTFT (streamed requests) and latency p50/p99 per class, the tokens the
server generated that no client received (``wasted``: the server's completion-token counter minus
what the clients were given; per abandoned request), how long the server took to go idle after the
clients stopped, and the server's RSS (start, peak, end). --baseline first runs the same load with
no faults, for the goal "p99 TTFT of the served requests within 2x of the same load without faults".

    .venv/bin/python ci/bench/bench_load.py ARTIFACT [--engines llamacpp,tvm] [--clients 8,32,64]
        [--duration 60] [--baseline] [--serve "python -m lantern.cli serve"] [--json out.json]

--serve runs another `lantern serve` (e.g. an older checkout's, through PYTHONPATH) for a before/after.
Everything is bounded: each level stops sending after --duration seconds, waits at most
--drain seconds for requests in flight, and the server is killed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from browser import serve_process  # noqa: E402

PROSE = (ROOT / "compiler" / "calibration_data" / "mixed_english.txt").read_text()

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}},
    },
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 32}},
        },
    },
}
CLASSES = ("short", "long", "json", "tools")
WEIGHTS = (0.4, 0.2, 0.25, 0.15)
CITIES = ("Paris", "Lima", "Oslo", "Nairobi", "Kyoto", "Quito", "Perth", "Bergen")


def request_body(kind: str, stream: bool, rng: random.Random, model: str) -> dict:
    city = rng.choice(CITIES)
    body: dict = {"model": model, "stream": stream, "temperature": 0.7, "seed": rng.randrange(1 << 30), "max_tokens": 64}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kind == "short":
        body["messages"] = [{"role": "user", "content": f"Tell me one fact about {city}."}]
    elif kind == "long":
        start = rng.randrange(0, len(PROSE) - 2600)
        body["messages"] = [{"role": "user", "content": "Summarize this:\n\n" + PROSE[start : start + 2500]}]
    elif kind == "json":
        body["messages"] = [{"role": "user", "content": f"Make up a person from {city} as JSON."}]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        body["max_tokens"] = 96
    else:
        body["messages"] = [{"role": "user", "content": f"What is the weather in {city}?"}]
        body["tools"], body["tool_choice"] = [TOOL], "required"
    return body


@dataclass
class Record:
    kind: str
    stream: bool
    fault: str  # "" | "leave" | "timeout"
    status: int = 0
    ttft: float | None = None
    latency: float | None = None
    delivered: int = 0  # completion tokens the client received
    finished: bool = False  # the whole answer arrived
    retry_after: float | None = None
    error: str | None = None


async def _read_headers(reader) -> tuple[int, dict[str, str]]:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection before answering")
    status = int(line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def _chunks(reader):
    """The body of a chunked response, piece by piece."""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size)
        await reader.readline()
        yield data


async def send(port: int, body: dict, rec: Record) -> None:
    """One chat completion over a raw HTTP/1.1 connection, recorded into ``rec``; cancelling it (the
    fault's timer) closes the socket, as a client that leaves does."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        data = json.dumps(body).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data
        )
        await writer.drain()
        rec.status, headers = await _read_headers(reader)
        if "retry-after" in headers:
            rec.retry_after = float(headers["retry-after"])
        if headers.get("transfer-encoding") == "chunked":
            pieces = _chunks(reader)
        else:
            payload = await reader.readexactly(int(headers.get("content-length", 0)))
            pieces = _once(payload)
        buffer = b""
        async for piece in pieces:
            buffer += piece
            if rec.status != 200 or not body["stream"]:
                continue
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                text = event.decode().removeprefix("data: ")
                if text == "[DONE]":
                    rec.finished = True
                    continue
                chunk = json.loads(text)
                if "error" in chunk:
                    rec.error = chunk["error"].get("code") or chunk["error"].get("type")
                    continue
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("tool_calls"):
                        rec.ttft = rec.ttft or time.perf_counter() - started
                        rec.delivered += 1  # about a token a chunk; the usage chunk sets the exact count
                if chunk.get("usage"):
                    rec.delivered = chunk["usage"]["completion_tokens"]
        if rec.status == 200 and not body["stream"]:
            answer = json.loads(buffer)
            rec.delivered, rec.finished = answer["usage"]["completion_tokens"], True
        if rec.status == 200 and rec.finished:
            rec.latency = time.perf_counter() - started
    finally:
        writer.close()


async def _once(payload: bytes):
    yield payload


async def metrics(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        _, headers = await _read_headers(reader)
        if headers.get("transfer-encoding") == "chunked":
            return b"".join([c async for c in _chunks(reader)]).decode()
        return (await reader.read()).decode()
    finally:
        writer.close()


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples (0 when the server does not have it)."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def client(
    port: int, model: str, rng: random.Random, until: float, faults: bool, client_timeout: float, records: list[Record]
) -> None:
    while time.perf_counter() < until:
        kind = rng.choices(CLASSES, WEIGHTS)[0]
        stream = rng.random() < 0.5
        roll = rng.random()
        fault = "" if not faults else "leave" if roll < 0.2 else "timeout" if roll < 0.3 else ""
        body = request_body(kind, stream, rng, model)
        limit = None
        if fault == "leave":
            limit = rng.uniform(0.1, 4.0)
        elif fault == "timeout":
            limit = client_timeout
            body["timeout"] = client_timeout
        rec = Record(kind, stream, fault)
        records.append(rec)
        try:
            await asyncio.wait_for(send(port, body, rec), limit)
        except asyncio.TimeoutError:
            pass  # the client left (its socket is closed)
        except Exception as err:  # noqa: BLE001 (the bench reports every kind of failure)
            rec.error = f"{type(err).__name__}: {err}"
        if rec.status == 429:
            await asyncio.sleep(min(rec.retry_after or 1.0, 5.0))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run_level(
    port: int, pid: int, model: str, clients: int, duration: float, faults: bool, client_timeout: float, drain: float, seed: int
) -> dict:
    before = await metrics(port)
    records: list[Record] = []
    rss_samples: list[int] = []
    started = time.perf_counter()
    until = started + duration
    tasks = [
        asyncio.create_task(client(port, model, random.Random(seed * 1000 + i), until, faults, client_timeout, records))
        for i in range(clients)
    ]

    async def sample():
        while True:
            rss_samples.append(rss(pid))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    done, pending = await asyncio.wait(tasks, timeout=duration + drain)
    for t in pending:  # requests still unanswered past the drain: given up on
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    clients_done = time.perf_counter()
    # then the server should go idle: nothing queued, nothing generating
    idle_after, left = None, None
    while time.perf_counter() - clients_done < drain:
        text = await metrics(port)
        left = metric(text, "lantern_queue_depth")
        if left == 0:
            idle_after = time.perf_counter() - clients_done
            break
        await asyncio.sleep(0.5)
    sampler.cancel()
    after = await metrics(port)
    elapsed = clients_done - started
    generated = metric(after, "lantern_completion_tokens_total") - metric(before, "lantern_completion_tokens_total")
    delivered = sum(r.delivered for r in records)
    # left before the whole answer came: while waiting for the status line, or mid-stream
    abandoned = [r for r in records if r.fault and r.status in (0, 200) and not r.finished]
    served = [r for r in records if r.status == 200 and r.finished and not r.error]
    row = {
        "clients": clients,
        "faults": faults,
        "seconds": round(elapsed, 1),
        "requests": len(records),
        "completed": len(served),
        "abandoned": len(abandoned),
        "rate_429": _rate(records, lambda r: r.status == 429),
        "rate_504": _rate(records, lambda r: r.status == 504 or r.error == "timeout"),
        "other_5xx": sum(1 for r in records if r.status >= 500 and r.status not in (503, 504)),
        "client_errors": sorted({r.error for r in records if r.error and r.error != "timeout"})[:5],
        "delivered_tok_per_s": round(delivered / elapsed, 1),
        "generated_tokens": int(generated),
        "delivered_tokens": delivered,
        "wasted_tokens": int(generated - delivered),
        "wasted_per_abandoned": round((generated - delivered) / len(abandoned), 1) if abandoned else None,
        "server_tokens_after_cancel": int(
            metric(after, "lantern_tokens_after_cancel_total") - metric(before, "lantern_tokens_after_cancel_total")
        ),
        "idle_after_s": None if idle_after is None else round(idle_after, 1),
        "queue_left": left,
        "rss_mb": [round(x / 2**20) for x in (rss_samples[0], max(rss_samples), rss_samples[-1])] if rss_samples else None,
        "per_class": {},
    }
    for kind in CLASSES:
        mine = [r for r in served if r.kind == kind]
        ttft = [r.ttft for r in mine if r.stream and r.ttft is not None]
        lat = [r.latency for r in mine]
        row["per_class"][kind] = {
            "n": len(mine),
            "ttft_p50": _r(pct(ttft, 0.5)),
            "ttft_p99": _r(pct(ttft, 0.99)),
            "latency_p50": _r(pct(lat, 0.5)),
            "latency_p99": _r(pct(lat, 0.99)),
        }
    ttft_all = [r.ttft for r in served if r.stream and r.ttft is not None]
    row["ttft_p99"] = _r(pct(ttft_all, 0.99))
    return row


def _rate(records, pred) -> float:
    return round(sum(1 for r in records if pred(r)) / len(records), 3) if records else 0.0


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def print_row(engine: str, row: dict) -> None:
    c = row["per_class"]
    print(
        f"{engine:9s} {row['clients']:3d} {'faults' if row['faults'] else 'none':6s} "
        f"req {row['requests']:4d} ok {row['completed']:4d} 429 {row['rate_429']:.2f} 504 {row['rate_504']:.2f} "
        f"5xx {row['other_5xx']} tok/s {row['delivered_tok_per_s']:6.1f} ttft p99 {row['ttft_p99']} "
        f"wasted {row['wasted_tokens']} ({row['wasted_per_abandoned']}/abandoned, server says "
        f"{row['server_tokens_after_cancel']}) idle after {row['idle_after_s']} s (queue left {row['queue_left']}) "
        f"rss MB {row['rss_mb']}",
        flush=True,
    )
    for kind in CLASSES:
        k = c[kind]
        print(
            f"    {kind:6s} n {k['n']:4d}  ttft p50/p99 {k['ttft_p50']}/{k['ttft_p99']} s  "
            f"latency p50/p99 {k['latency_p50']}/{k['latency_p99']} s",
            flush=True,
        )
    if row["client_errors"]:
        print(f"    errors: {row['client_errors']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path, help="artifact folder built by `lantern build` (with a GGUF for llamacpp)")
    ap.add_argument("--engines", default="llamacpp,tvm")
    ap.add_argument("--clients", default="8,32,64", help="load levels: concurrent clients")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds each level sends requests")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds to wait for answers and an idle server")
    ap.add_argument("--client-timeout", type=float, default=8.0, help="the timing-out clients' give-up time")
    ap.add_argument("--baseline", action="store_true", help="first run each level without faults")
    ap.add_argument("--serve", default=f"{sys.executable} -m lantern.cli serve", help="the server command")
    ap.add_argument("--server-args", default="", help="more arguments for the server, e.g. '--max-queue 32'")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()

    rows = []
    for engine in args.engines.split(","):
        proc, base = serve_process(
            [str(args.artifact.resolve()), "--engine", engine, *shlex.split(args.server_args)], shlex.split(args.serve)
        )
        port = int(base.rsplit(":", 1)[1])
        model = json.load(urllib.request.urlopen(base + "/v1/models"))
        name = model["data"][0]["id"]
        try:
            for n in (int(x) for x in args.clients.split(",")):
                for faults in [False, True] if args.baseline else [True]:
                    row = asyncio.run(
                        run_level(port, proc.pid, name, n, args.duration, faults, args.client_timeout, args.drain, args.seed)
                    )
                    row["engine"] = engine
                    rows.append(row)
                    print_row(engine, row)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                print(f"{engine}: the server did not exit within 30 s of SIGTERM; killed", flush=True)
                proc.kill()
                proc.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
