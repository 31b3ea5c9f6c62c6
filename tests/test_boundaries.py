"""Every number a caller gives that the engine narrows (to float32: temperature, top_p; to an integer type: seeds,
token budgets, tool counts; deadlines compared as floats), at the edges of what it accepts, through the CLI
(`runtime run`, `runtime serve`'s options) and HTTP (`runtime serve`'s app on 127.0.0.1: /v1/discover,
/v1/chat/completions): each value is answered, or refused with a typed error naming the field (exit code 2 /
HTTP 400), never a 500, a traceback or a crash. A top_p as small as 1e-300 (0 in float32) answers as greedy."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolcall.common.errors import EXIT_CODES
from toolcall.runtime.cli import main as runtime_cli

REQUEST = "Book a flight to Paris and a hotel there"
OK, REFUSED = "ok", "refused"
SEED_END = 2**63  # the first seed refused: the generator's key is a uint64, every edge takes [0, 2^63)

# (option, value as typed, expected); temperature 0.7 is added where the option only matters when sampling
CLI_RUN = [
    ("temperature", "0", OK), ("temperature", "2.3e-308", OK), ("temperature", "10000", OK),
    ("temperature", "1e-310", REFUSED), ("temperature", "10000.5", REFUSED), ("temperature", "-0.1", REFUSED),
    ("temperature", "nan", REFUSED), ("temperature", "inf", REFUSED), ("temperature", "-inf", REFUSED),
    ("top-p", "1e-300", OK), ("top-p", "5e-324", OK), ("top-p", "1", OK),
    ("top-p", "0", REFUSED), ("top-p", "-0.0", REFUSED), ("top-p", "1.0000001", REFUSED), ("top-p", "nan", REFUSED),
    ("top-p", "inf", REFUSED),
    ("seed", str(SEED_END - 1), OK), ("seed", str(SEED_END), REFUSED), ("seed", "-1", REFUSED),
    ("seed", str(10**30), REFUSED), ("seed", "1e3", REFUSED),
    ("threads", "0", REFUSED), ("threads", "-1", REFUSED),
]
CLI_SERVE = [  # refused before anything loads; accepted values are what every other serve test starts with
    ("request-timeout", "0"), ("request-timeout", "-1"), ("request-timeout", "nan"), ("request-timeout", "inf"),
    ("request-timeout", "86400.5"), ("drain-grace", "0.5"), ("drain-grace", "nan"), ("drain-grace", "inf"),
    ("port", "-1"), ("port", "65536"), ("max-queue-requests", "0"), ("max-body-bytes", "-1"), ("lanes", "0"),
]


def runtime(*args):
    return CliRunner().invoke(runtime_cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def greedy_answer(shipped_bundle):
    result = runtime("run", shipped_bundle, "--json", REQUEST)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["results"][0]


@pytest.mark.parametrize("option, value, expected", CLI_RUN, ids=[f"{o}={v}" for o, v, _ in CLI_RUN])
def test_runtime_run_at_the_edges(shipped_bundle, greedy_answer, option, value, expected):
    sampled = ["--temperature", "0.7"] if option in ("top-p", "seed") else []
    result = runtime("run", shipped_bundle, "--json", *sampled, f"--{option}", value, REQUEST)
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)
    if expected == OK:
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)["results"][0]
        assert answer["tools"] and answer["finish"] == "done"
        if option == "top-p" and float(value) < 1e-30:  # 0 in float32 (or a subnormal): the most likely, as greedy
            assert answer["token_ids"] == greedy_answer["token_ids"]
    else:
        assert result.exit_code == EXIT_CODES["usage"], result.output
        error = json.loads(result.stdout)
        assert error["error"] == "usage" and error["details"]["option"] == option.replace("-", "_")
        assert f"--{option}" in error["message"] or f"'--{option}'" in error["message"]


@pytest.mark.parametrize("option, value", CLI_SERVE, ids=[f"{o}={v}" for o, v in CLI_SERVE])
def test_runtime_serve_options_at_the_edges(shipped_bundle, option, value):
    pytest.importorskip("fastapi")
    result = runtime("serve", shipped_bundle, f"--{option}", value)
    assert result.exit_code == EXIT_CODES["usage"] and f"--{option}" in result.output, result.output
    assert "Traceback" not in result.output


# -- HTTP ---------------------------------------------------------------------------------------------------------

LIMIT = "LIMIT"  # the bundle's max_output_tokens, filled in per test
# (endpoint, field, JSON value as sent, expected); NaN and Infinity as Python's json module writes them
HTTP = [
    ("discover", "temperature", "0", OK), ("discover", "temperature", "2.3e-308", OK),
    ("discover", "temperature", "10000", OK), ("discover", "temperature", "10000.5", REFUSED),
    ("discover", "temperature", "1e-310", REFUSED), ("discover", "temperature", "-0.1", REFUSED),
    ("discover", "temperature", "NaN", REFUSED), ("discover", "temperature", "Infinity", REFUSED),
    ("discover", "top_p", "1e-300", OK), ("discover", "top_p", "5e-324", OK), ("discover", "top_p", "1", OK),
    ("discover", "top_p", "0", REFUSED), ("discover", "top_p", "-0.0", REFUSED),
    ("discover", "top_p", "1.0000001", REFUSED), ("discover", "top_p", "NaN", REFUSED),
    ("discover", "top_p", "-Infinity", REFUSED),
    ("discover", "seed", str(SEED_END - 1), OK), ("discover", "seed", str(SEED_END), REFUSED),
    ("discover", "seed", "-1", REFUSED), ("discover", "seed", str(10**30), REFUSED), ("discover", "seed", "1.5", REFUSED),
    ("discover", "timeout_s", "0.1", OK), ("discover", "timeout_s", "86400", OK),
    ("discover", "timeout_s", "0.09", REFUSED), ("discover", "timeout_s", "86400.1", REFUSED),
    ("discover", "timeout_s", "NaN", REFUSED), ("discover", "timeout_s", "Infinity", REFUSED),
    ("discover", "max_output_tokens", "1", OK), ("discover", "max_output_tokens", LIMIT, OK),
    ("discover", "max_output_tokens", "0", REFUSED), ("discover", "max_output_tokens", str(2**31), REFUSED),
    ("discover", "max_output_tokens", str(2**64), REFUSED), ("discover", "max_output_tokens", "2.5", REFUSED),
    ("discover", "max_tools", "1", OK), ("discover", "max_tools", "0", REFUSED),
    ("discover", "max_tools", str(10**30), REFUSED),
    ("chat", "temperature", "2", OK), ("chat", "temperature", "2.0001", REFUSED), ("chat", "temperature", "NaN", REFUSED),
    ("chat", "temperature", "1e-310", REFUSED),
    ("chat", "top_p", "1e-300", OK), ("chat", "top_p", "0", REFUSED), ("chat", "top_p", "NaN", REFUSED),
    ("chat", "top_p", "1.5", REFUSED),
    ("chat", "seed", str(SEED_END - 1), OK), ("chat", "seed", str(SEED_END), REFUSED), ("chat", "seed", "-1", REFUSED),
    # max_tokens / max_completion_tokens cap the answer at the bundle's limit (documented): any whole number >= 1
    ("chat", "max_tokens", "1", OK), ("chat", "max_tokens", str(10**30), OK), ("chat", "max_tokens", "0", REFUSED),
    ("chat", "max_completion_tokens", str(2**64), OK), ("chat", "max_completion_tokens", "-1", REFUSED),
    ("chat", "max_completion_tokens", "1e3", REFUSED),
    ("chat", "timeout_s", "0.1", OK), ("chat", "timeout_s", "0.05", REFUSED), ("chat", "timeout_s", "NaN", REFUSED),
    ("chat", "timeout_s", "Infinity", REFUSED),
    ("chat", "presence_penalty", "0", OK), ("chat", "presence_penalty", "NaN", REFUSED),
]


@pytest.fixture(scope="module")
def server(shipped_bundle):
    pytest.importorskip("fastapi")
    from test_serve import LiveServer

    from toolcall.runtime.engine import Engine
    from toolcall.runtime.serve.state import ServeConfig, ServeState

    engine = Engine.load(shipped_bundle)
    srv = LiveServer(ServeState(lambda: engine, ServeConfig(served_model_names=("m",), lanes=1)))
    yield srv, engine
    srv.close()


def post(srv, endpoint: str, fields: str) -> tuple[int, dict]:
    """POST a body written by hand (so NaN, Infinity and integers past 2^64 reach the server as sent)."""
    if endpoint == "discover":
        raw = f'{{"request": "{REQUEST}"{fields}}}'
        path = "/v1/discover"
    else:
        raw = f'{{"model": "m", "messages": [{{"role": "user", "content": "{REQUEST}"}}]{fields}}}'
        path = "/v1/chat/completions"
    status, _, body = srv.call("POST", path, raw.encode())
    return status, body


def answer(endpoint: str, body: dict) -> list:
    """The answer's token ids (discover) or tool call names (chat: call ids differ per call)."""
    if endpoint == "discover":
        return body["token_ids"]
    return [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]]


def names_field(error: dict, field: str) -> bool:
    """The refusal names the field: in its message and in its details (the schema's problem locations, or the
    engine's ``field``)."""
    details = error["details"]
    located = any(field in p["loc"] for p in details.get("problems", [])) or details.get("field") == field
    return field in error["message"] and located


@pytest.mark.parametrize("endpoint, field, value, expected", HTTP, ids=[f"{e}-{f}={v}" for e, f, v, _ in HTTP])
def test_http_fields_at_the_edges(server, endpoint, field, value, expected):
    srv, engine = server
    if value == LIMIT:
        value = str(engine.contract.limits.max_output_tokens)
    sampled = ', "temperature": 0.7' if field in ("top_p", "seed") else ""
    status, body = post(srv, endpoint, f', "{field}": {value}{sampled}')
    if expected == OK:
        assert status == 200, body
        if field == "top_p" and float(value) < 1e-30:  # 0 in float32: the greedy answer
            _, greedy = post(srv, endpoint, "")
            assert answer(endpoint, body) == answer(endpoint, greedy)
    else:
        assert status == 400, body
        assert body["error"]["code"] == "request_invalid" and names_field(body["error"], field), body
