"""The API fuzzed from its own /openapi.json (schemathesis) against a live server on 127.0.0.1: a bounded
number of generated requests an operation, positive and negative, with the checks that apply — no server
error, responses that conform to the schema (bodies, headers, content types), documented status codes,
refused invalid bodies, 405s that carry Allow. It must find nothing.

Left out: positive_data_acceptance, which expects a 2xx for every schema-valid body. Some refusals depend on
what a JSON Schema cannot state — tool names outside the bundle's catalog, prompt token counts, lone
surrogates in strings, the queue — and are documented responses of the routes instead."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from test_serve import LiveServer  # noqa: E402

from toolcall.runtime.engine import Engine  # noqa: E402
from toolcall.runtime.serve.state import ServeConfig, ServeState  # noqa: E402

EXAMPLES = 25  # an operation (and mode): bounded in count; each request answers in milliseconds
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.response_schema_conformance,
          schemathesis.checks.status_code_conformance, schemathesis.checks.content_type_conformance,
          schemathesis.checks.response_headers_conformance, schemathesis.checks.negative_data_rejection,
          schemathesis.checks.unsupported_method, schemathesis.checks.allow_header_conformance]


@pytest.fixture(scope="module")
def live(tiny_bundle):
    engine = Engine.load(tiny_bundle)
    srv = LiveServer(ServeState(lambda: engine, ServeConfig(request_timeout_s=10.0, lanes=1)))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def api_schema(live):
    return schemathesis.openapi.from_url(f"http://127.0.0.1:{live.port}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_the_api_conforms_to_its_schema(case):
    case.call_and_validate(timeout=30, checks=CHECKS)
