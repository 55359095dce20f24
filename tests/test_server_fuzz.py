"""A schemathesis run against `lantern serve`'s own OpenAPI schema: no request it allows gets a 5xx.

The server runs a random tiny Llama (real SmolLM2 tokenizer and chat template) so that hundreds
of generated requests, response formats and tool definitions included, finish in seconds.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from browser import lantern_server, wait_until_ready

from lantern.server.app import Limits, ServerConfig


@schemathesis.check
def no_server_error_but_a_timeout_asked_for(ctx, response, case):
    """A 504 is the answer to a request whose own `timeout` (any positive number, 1e-308 too) ran out."""
    if response.status_code == 504 and isinstance(case.body, dict) and "timeout" in case.body:
        assert response.json()["error"]["code"] == "timeout", response.text
        return None
    return not_a_server_error(ctx, response, case)


@pytest.mark.slow
def test_no_request_the_schema_allows_gets_a_server_error(tiny_hf, build_artifact, report):
    folder, _, _ = tiny_hf
    config = ServerConfig([build_artifact(folder, "q0f32")], limits=Limits(max_tokens=8, max_queue=64))
    with lantern_server(config) as (base, _):
        wait_until_ready(base)
        schema = schemathesis.openapi.from_url(base + "/openapi.json")
        tested, calls = [], 0
        for result in schema.get_all_operations():
            operation = result.ok()

            @hypothesis.settings(
                max_examples=30, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck)
            )
            @hypothesis.given(operation.as_strategy())
            def run(case):
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=base, checks=[no_server_error_but_a_timeout_asked_for])

            run()
            tested.append(operation.label)
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"} <= set(tested)
    report(f"schemathesis: {calls} generated requests over {len(tested)} operations, no 5xx (but 504s for timeouts asked for)")
