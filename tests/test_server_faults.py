"""`lantern serve` under faults, caused for real: clients that leave mid-request, requests past their
deadline (running or still queued), a body sent too slowly, SIGTERM with requests running, and the
server killed mid-stream behind the browser's router. Each test reads what the server did from its
own /metrics, not from timing alone."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import threading
import time

import pytest

from browser import lantern_server, launch, serve_process
from test_runtime import open_page, user
from test_server import ENGINES, raw, served

from lantern import request_rules
from lantern.server.app import Limits, ServerConfig

pytestmark = pytest.mark.slow

LONG = 2000  # max_tokens of a request meant to outlive the test's patience (its stop tokens are banned)


@pytest.fixture(scope="module")
def smollm2(smollm2_q4):
    return smollm2_q4


def endless(art, **fields) -> dict:
    """A chat request that would generate LONG tokens: the model's stop tokens are banned."""
    chat = json.loads((art.path / "mlc-chat-config.json").read_text())
    ban = {str(t): -100 for t in request_rules.stop_token_ids(chat)}
    return {
        "model": art.path.name,
        "messages": user("Count from one to a thousand."),
        "max_tokens": LONG,
        "temperature": 0,
        "logit_bias": ban,
        **fields,
    }


def metrics(base: str) -> str:
    return raw(base, "GET", "/metrics")[1].decode()


def metric(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for(base: str, ready, seconds: float = 20.0) -> str:
    """Poll /metrics until ``ready(text)``; the last text either way."""
    end = time.monotonic() + seconds
    while True:
        text = metrics(base)
        if ready(text) or time.monotonic() > end:
            return text
        time.sleep(0.1)


def post(base: str, body: dict, timeout: float = 120) -> http.client.HTTPConnection:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"})
    return conn


def sse_events(resp) -> list:
    """The data of each server-sent event of a streamed response, in order ("[DONE]" as a string)."""
    events = []
    for line in resp.read().decode().split("\n"):
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("engine_name", ENGINES)
def test_clients_that_leave_stop_their_generation_running_or_queued(smollm2, engine_name):
    """Three unstreamed requests, one decoding and two in the queue (one sequence at a time), whose
    clients close their sockets after 1.5 s: all three stop, the running one within a token."""
    with served(smollm2, engine=engine_name, parallel=1) as (base, _):

        def leave():
            conn = post(base, endless(smollm2), timeout=1.5)
            with pytest.raises(TimeoutError):
                conn.getresponse()
            conn.close()

        threads = [threading.Thread(target=leave) for _ in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join()
        gone = 'lantern_cancelled_requests_total{reason="client_gone"}'
        closed = ("lantern_requests_total", '{path="/v1/chat/completions",status="499"}')
        # the generation's stop and the response's status are counted apart: wait for both
        text = wait_for(base, lambda m: metric(m, gone) == 3 and metric(m, *closed) == 3, seconds=10)
        assert metric(text, gone) == 3, text
        assert metric(text, "lantern_queue_depth", f'{{model="{smollm2.path.name}"}}') == 0, text
        assert metric(text, *closed) == 3, text
        made = metric(text, "lantern_completion_tokens_total")
        assert 0 < made < LONG / 4, text  # about 1.5 s of decoding, not 2000 tokens
        assert metric(text, "lantern_tokens_after_cancel_total") <= 3, text
        assert metric(text, "lantern_cancelled_tokens_saved_total") == 3 * LONG - made, text
        status, body = raw(base, "POST", "/v1/chat/completions", json.dumps({"messages": user("Hi"), "max_tokens": 2}).encode())
        assert status == 200, body  # nothing left running: answered at once


@pytest.mark.parametrize("engine_name", ENGINES)
def test_deadlines_end_requests_running_or_queued_and_the_server_default_applies(smollm2, engine_name):
    with served(smollm2, engine=engine_name, parallel=1, limits=Limits(request_timeout_s=1.5)) as (base, _):
        # unstreamed, past its own timeout while decoding: 504 that says so
        started = time.monotonic()
        status, body = raw(base, "POST", "/v1/chat/completions", json.dumps(endless(smollm2, timeout=1.0)).encode())
        took = time.monotonic() - started
        error = json.loads(body)["error"]
        assert status == 504 and error["code"] == "timeout" and error["param"] == "timeout", (status, error)
        assert re.match(r"the request reached its timeout of 1 s after \d+ tokens", error["message"]), error
        assert took < 5, took

        # streamed, with the server's default (1.5 s): the text so far, finish_reason "timeout", an error event
        resp = post(base, endless(smollm2, stream=True)).getresponse()
        events = sse_events(resp)
        assert resp.status == 200 and events[-1] == "[DONE]", events[-3:]
        chunks = [e for e in events[:-1] if "choices" in e]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "timeout", chunks[-1]
        assert events[-2]["error"]["code"] == "timeout" and "of 1.5 s" in events[-2]["error"]["message"], events[-2]

        # queued behind a running request (which has a longer deadline of its own): dropped before it starts
        first = post(base, endless(smollm2, timeout=4.0))
        time.sleep(0.5)
        started = time.monotonic()
        status, body = raw(base, "POST", "/v1/chat/completions", json.dumps(endless(smollm2, timeout=0.5)).encode())
        took = time.monotonic() - started
        error = json.loads(body)["error"]
        assert status == 504 and "before it started (it waited in the queue)" in error["message"], error
        assert took < 2.5, took  # not when the running request ends
        assert first.getresponse().status == 504  # which ends at its own 4 s
        text = metrics(base)
        assert metric(text, 'lantern_cancelled_requests_total{reason="timeout"}') == 4, text
        assert metric(text, 'lantern_generations_total{finish_reason="timeout"}') == 4, text


def test_a_timeout_that_is_not_a_positive_number_is_named():
    with lantern_server(ServerConfig([])) as (base, _):
        for bad in (0, -1, "soon", float("inf")):
            body = json.dumps({"messages": user("Hi"), "timeout": bad}).replace("Infinity", "1e999")
            status, answer = raw(base, "POST", "/v1/chat/completions", body.encode())
            error = json.loads(answer)["error"]
            assert status == 400 and error["param"] == "timeout", (bad, status, error)
            assert error["message"].startswith("timeout:"), error


def test_a_body_sent_too_slowly_gets_408_while_others_are_served():
    limits = Limits(body_timeout_s=1.0, max_body_bytes=4096)
    with lantern_server(ServerConfig([], limits=limits)) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 200\r\n\r\n{"messages": '
        )  # and then nothing more
        started = time.monotonic()
        assert raw(base, "GET", "/v1/models")[0] == 200  # the server is not held up meanwhile
        slow.settimeout(10)
        answer = http.client.HTTPResponse(slow)
        answer.begin()
        took = time.monotonic() - started
        error = json.loads(answer.read())["error"]
        slow.close()
        assert answer.status == 408 and error["code"] == "request_timeout", (answer.status, error)
        assert "did not arrive within 1 s (13 bytes came)" in error["message"] and 0.5 < took < 5, (error, took)

        # a chunked body has no content-length to refuse up front: it is cut at the limit
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=iter([b"[" + b"1," * 4000 + b"1]"]),
            headers={"content-type": "application/json"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        assert resp.status == 413, resp.read()


def start_serve(art, engine: str, *flags: str):
    return serve_process([str(art.path), "--engine", engine, *flags])


@pytest.mark.parametrize("engine_name", ENGINES)
def test_sigterm_under_load_exits_within_the_shutdown_timeout(smollm2, engine_name):
    """Two streams (both decoding on llamacpp, one queued on tvm), two unstreamed requests, one client
    already gone: after SIGTERM no new connection is taken, and the process exits within
    --shutdown-timeout and a step."""
    proc, base = start_serve(smollm2, engine_name, "--shutdown-timeout", "2")
    try:
        streams = [post(base, endless(smollm2, stream=True)).getresponse() for _ in range(2)]
        assert all(s.status == 200 for s in streams)
        assert streams[0].readline().startswith(b"data: ")  # decoding
        waiting = [post(base, endless(smollm2)) for _ in range(2)]
        gone = post(base, endless(smollm2))
        gone.close()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(2 + 8)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
        err = proc.stderr.read()
    assert code in (0, -signal.SIGTERM) and took < 2 + 8, (code, took, err[-2000:])  # uvicorn re-raises SIGTERM
    assert "Traceback" not in err, err[-3000:]
    for s in streams:  # cut, with the reason, never completed
        events = sse_events(s)
        assert "[DONE]" not in events and events[-1]["error"]["code"] == "shutting_down", events[-2:]
    for conn in waiting:
        resp = conn.getresponse()
        assert resp.status == 503 and json.loads(resp.read())["error"]["code"] == "shutting_down"
    with pytest.raises(OSError):
        raw(base, "GET", "/health")


def test_the_router_reports_a_cloud_killed_mid_stream_as_a_typed_error(smollm2, playwright):
    """The cloud (`lantern serve`, its own process) is killed with SIGKILL after the first chunk:
    the router's stream fails with NetworkError, and does not end as if the answer were complete."""
    with lantern_server([smollm2.path]) as (page_base, _):
        browser = launch(playwright, webgpu=False)
        proc, cloud = start_serve(smollm2, "llamacpp", "--cors", page_base)
        try:
            page = open_page(browser, page_base)
            page.expose_function("killCloud", lambda: os.kill(proc.pid, signal.SIGKILL))
            out = page.evaluate(
                """async ([options, req]) => {
                const router = await lantern.createRouter(options);
                const chunks = [];
                try {
                    for await (const c of await router.chat.completions.create(req)) {
                        chunks.push(c);
                        if (chunks.length === 2) await window.killCloud();
                    }
                    return { chunks, error: null };
                } catch (err) {
                    return { chunks, error: { name: err.name, message: err.message } };
                }
            }""",
                [
                    {
                        "local": {"model": f"/models/{smollm2.path.name}/"},
                        "policy": "cloud",
                        "cloud": {"baseURL": cloud + "/v1", "model": smollm2.path.name},
                    },
                    {**endless(smollm2, stream=True), "max_tokens": 400},
                ],
            )
        finally:
            browser.close()
            proc.kill()
            proc.wait()
    assert len(out["chunks"]) >= 2 and out["chunks"][0]["lantern_route"] == "cloud", out["chunks"][:2]
    assert all(c["choices"][0]["finish_reason"] is None for c in out["chunks"] if c["choices"]), out["chunks"][-1]
    assert out["error"] and out["error"]["name"] == "NetworkError", out["error"]
    assert "the stream closed before its end" in out["error"]["message"] or "the stream broke" in out["error"]["message"], out[
        "error"
    ]
