"""`runtime serve` in-process on 127.0.0.1 (ephemeral port, started and stopped in each test):
endpoints, typed errors, tools subset, openai client, 429, deadline, disconnect abort, drain."""
from __future__ import annotations

import copy
import http.client
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from toolcall.runtime.engine import Engine  # noqa: E402
from toolcall.runtime.serve.app import create_app  # noqa: E402
from toolcall.runtime.serve.state import ServeConfig, ServeState  # noqa: E402

TEXTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
         "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome"]
METRICS = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
           "generation_tokens_total", "request_success_total", "time_to_first_token_seconds",
           "e2e_request_latency_seconds", "request_queue_time_seconds", "requests_rejected_total", "kv_pages_free",
           "kv_pages_in_use", "engine_step_seconds", "prefix_cache_queries_total", "prefix_cache_hits_total"]


def metric(text: str, name: str, **labels) -> float:
    """The sum of series ``toolcall:<name>`` whose labels include ``labels``, from /metrics' text."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"toolcall:{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "").split(",") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def wait_for(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class LiveServer:
    """uvicorn on 127.0.0.1:0 in a thread, over a ServeState; closed by ``close`` (or ``with``)."""

    def __init__(self, state: ServeState, wait_ready: bool = True):
        self.state = state
        config = uvicorn.Config(create_app(state), host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, what="server start")
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        if wait_ready:
            wait_for(lambda: state.phase != "loading", what="engine load")

    def call(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return resp.status, resp.headers, parsed  # headers: case-insensitive

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Paced:
    """A generator whose steps wait on ``gate`` and take at least ``delay`` s (faults need time)."""

    def __init__(self, inner, delay=0.0):
        self.inner, self.delay = inner, delay
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self):
        self.gate.wait(20)
        time.sleep(self.delay)
        return self.inner.step()


@pytest.fixture(scope="module")
def engine(tiny_bundle):
    return Engine.load(tiny_bundle)


@pytest.fixture(scope="module")
def solo(engine):
    return {t: r for t, r in zip(TEXTS, engine.run(TEXTS))}


def paced(engine, delay=0.0):
    e = copy.copy(engine)
    e.generator = Paced(engine.generator, delay)
    return e


def serve(engine, **config) -> LiveServer:
    if isinstance(engine.generator, Paced):  # the stand-in steps as given: not split into lanes
        config.setdefault("lanes", 1)
    return LiveServer(ServeState(lambda: engine, ServeConfig(**config)))


def assert_error(status, body, want_status, code):
    assert status == want_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code and "Traceback" not in json.dumps(body)


def test_discover_answers_as_each_request_alone(engine, solo):
    with serve(engine) as srv:
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda t: srv.call("POST", "/v1/discover", {"request": t}), TEXTS * 3))
    for text, (status, _, body) in zip(TEXTS * 3, replies):
        assert status == 200, body
        assert body["tools"] == solo[text].tools and body["token_ids"] == solo[text].token_ids
        assert body["prompt_token_ids"] == list(engine.encode(text)) and body["finish"] == "done"
        assert 0 < body["ttft_ms"] <= body["total_ms"]
    assert engine.generator.kv.pages_in_use == 0


def test_a_tools_subset_restricts_the_answer(engine, solo):
    names = list(engine.grammar.tool_names)
    text = TEXTS[0]
    keep = solo[text].tools[:1]
    with serve(engine) as srv:
        status, _, body = srv.call("POST", "/v1/discover", {"request": text, "tools": keep})
        assert status == 200 and body["tools"] == keep
        others = [n for n in names if n not in solo[text].tools][:3]
        status, _, body = srv.call("POST", "/v1/discover", {"request": text, "tools": others})
        assert status == 200 and body["tools"] and set(body["tools"]) <= set(others)
        status, _, body = srv.call("POST", "/v1/discover", {"request": text, "tools": [names[0], "no_such_tool"]})
        assert_error(status, body, 400, "unknown_tool")
        assert "no_such_tool" in body["error"]["message"] and body["error"]["details"]["unknown"] == ["no_such_tool"]
        status, _, body = srv.call("POST", "/v1/discover", {"request": text, "tools": []})
        assert_error(status, body, 400, "request_invalid")  # the schema states a subset is non-empty
        assert body["error"]["details"]["problems"][0]["loc"] == ["tools"]


def test_bad_requests_are_typed_4xx_never_500(engine, caplog):
    caplog.set_level(logging.WARNING)
    cases = [(b'{"request": "x"', 400, "request_invalid"),  # bad JSON
             (b'{"request": 3}', 400, "request_invalid"),  # wrong type
             (b'{"request": "x", "temperature": -1}', 400, "request_invalid"),
             (b'{"request": "x", "surprise": 1}', 400, "request_invalid"),
             (b'{"request": "caf\xff"}', 400, "request_invalid"),  # invalid UTF-8
             (b'[]', 400, "request_invalid"), (b'', 400, "request_invalid"),
             (json.dumps({"request": "word " * 400}).encode(), 413, "prompt_too_long"),
             (json.dumps({"request": "x" * 70000}).encode(), 413, "body_too_large")]
    with serve(engine) as srv:
        for body, status, code in cases:
            got, _, reply = srv.call("POST", "/v1/discover", body)
            assert_error(got, reply, status, code)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)  # no Content-Length: chunked
        conn.request("POST", "/v1/discover", body=iter([b'{"request": "', b"x" * 40000, b"y" * 40000, b'"}']),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        assert_error(resp.status, json.loads(resp.read()), 413, "body_too_large")
        conn.close()
        got, _, reply = srv.call("POST", "/v1/chat/completions", b"\x00\x01")
        assert_error(got, reply, 400, "request_invalid")
        got, _, reply = srv.call("POST", "/v1/chat/completions", {"model": "x", "messages": []})
        assert_error(got, reply, 400, "request_invalid")
        got, headers, reply = srv.call("GET", "/v1/discover")
        assert_error(got, reply, 405, "method_not_allowed")
        assert headers["Allow"] == "POST" and reply["error"]["details"]["allowed"] == ["POST"]
        got, _, reply = srv.call("GET", "/no/such/path")
        assert_error(got, reply, 404, "not_found")
        status, _, body = srv.call("POST", "/v1/discover", {"request": TEXTS[0]})
        assert status == 200  # the bad ones disturbed nothing
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_bodies_are_json_in_utf8_and_say_what_is_wrong_where(engine):
    with serve(engine) as srv:
        got, _, reply = srv.call("POST", "/v1/discover", b'{"request": "caf\xff"}')
        assert_error(got, reply, 400, "request_invalid")
        assert "not valid UTF-8" in reply["error"]["message"] and reply["error"]["details"]["byte"] == 16
        got, _, reply = srv.call("POST", "/v1/discover", b'{"request": "a \\ud800 b"}')
        assert_error(got, reply, 400, "request_invalid")
        assert "lone surrogate" in reply["error"]["message"] and reply["error"]["details"]["field"] == "body.request"
        got, _, reply = srv.call("POST", "/v1/discover", b'{"request": "x",}')
        assert_error(got, reply, 400, "request_invalid")
        assert "not valid JSON" in reply["error"]["message"] and reply["error"]["details"]["column"] == 17
        for media in ("text/plain", "application/x-www-form-urlencoded", ""):
            got, _, reply = srv.call("POST", "/v1/discover", {"request": "x"}, headers={"Content-Type": media})
            assert_error(got, reply, 415, "unsupported_media_type")
        got, _, reply = srv.call("POST", "/v1/discover", {"request": "x"},
                                 headers={"Content-Type": "application/json; charset=utf-8"})
        assert got == 200
        metrics = srv.call("GET", "/metrics")[2]
        assert metric(metrics, "requests_rejected_total", reason="unsupported_media_type") == 3
        assert metric(metrics, "requests_rejected_total", reason="request_invalid") == 3


def test_models_contract_health_metrics_and_openapi(engine, tiny_bundle):
    with serve(engine) as srv:
        status, _, models = srv.call("GET", "/v1/models")
        card = models["data"][0]
        assert status == 200 and card["id"] == tiny_bundle.name and card["tools"] == list(engine.grammar.tool_names)
        assert card["bundle_id"] == engine.contract.engine.bundle_id and card["device"] == "native"
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("GET", "/v1/contract")
        assert conn.getresponse().read() == (tiny_bundle / "contract.json").read_bytes()
        conn.close()
        for path, want in [("/health", {"status": "ready", "device": "native"}),
                           ("/health/ready", {"status": "ready", "device": "native"}), ("/health/live", {"status": "alive"})]:
            assert srv.call("GET", path)[::2] == (200, want)
        srv.call("POST", "/v1/discover", {"request": TEXTS[1]})
        srv.call("POST", "/v1/discover", {"request": TEXTS[1], "tools": ["nope"]})
        status, headers, text = srv.call("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        for name in METRICS:
            assert f"toolcall:{name}" in text, name
        assert metric(text, "request_success_total", finished_reason="stop", model_name=tiny_bundle.name) == 1
        assert metric(text, "requests_rejected_total", reason="unknown_tool", model_name=tiny_bundle.name) == 1
        assert metric(text, "engine_info", device="native", target="cpu", precision="fp8_e4m3") == 1
        series = [line for line in text.splitlines() if line.startswith("toolcall:")]
        assert series and all('model_name="' in line for line in series)
        hits = metric(text, "prefix_cache_hits_total")
        assert hits >= engine.contract.prompt.prefix_tokens  # the request reused the pinned prefix
        status, _, spec = srv.call("GET", "/openapi.json")
        paths = spec["paths"]
        for path in ["/v1/discover", "/v1/chat/completions", "/v1/models", "/v1/contract", "/health", "/health/live",
                     "/health/ready", "/metrics"]:
            assert path in paths, path
        post = paths["/v1/discover"]["post"]
        assert {"200", "400", "413", "429", "503", "504"} <= set(post["responses"])
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/DiscoverRequest")
        assert {"DiscoverRequest", "ChatCompletionRequest", "ErrorBody"} <= set(spec["components"]["schemas"])
        status, _, html = srv.call("GET", "/docs")
        assert status == 200 and "swagger" in html.lower()
        assert not re.findall(r"https?://", html), "the docs page loads something from the network"
        assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", html) + re.findall(r"url: ?'([^']+)'", html)
        assert len(assets) >= 3  # Swagger UI's script and stylesheet, the favicon, the spec
        for asset in assets:  # every one from this server itself
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", asset)
            resp = conn.getresponse()
            assert resp.status == 200 and len(resp.read()) > 100, asset
            conn.close()


def test_the_openai_client_calls_chat_completions(engine, solo, tiny_bundle):
    openai = pytest.importorskip("openai")
    text = TEXTS[2]
    with serve(engine) as srv:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0, timeout=30)
        out = client.chat.completions.create(model=tiny_bundle.name, messages=[
            {"role": "system", "content": "Name the tools."}, {"role": "user", "content": text}])
        choice = out.choices[0]
        assert [c.function.name for c in choice.message.tool_calls] == solo[text].tools
        assert all(c.function.arguments == "{}" and c.type == "function" for c in choice.message.tool_calls)
        assert choice.finish_reason == "tool_calls"
        assert out.usage.completion_tokens == len(solo[text].token_ids)
        assert out.usage.prompt_tokens == len(engine.encode(text))
        keep = solo[text].tools[:1]
        tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
                 for n in keep]
        out = client.chat.completions.create(model=tiny_bundle.name, messages=[{"role": "user", "content": text}],
                                             tools=tools)
        assert [c.function.name for c in out.choices[0].message.tool_calls] == keep
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=tiny_bundle.name, messages=[{"role": "user", "content": text}],
                                           tools=[{"type": "function", "function": {"name": "not_a_tool"}}])
        assert e.value.body["code"] == "unknown_tool"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="other-model", messages=[{"role": "user", "content": text}])


def test_a_full_queue_is_429_with_retry_after(engine, solo):
    e = paced(engine)
    e.generator.gate.clear()  # the engine thread blocks in its first step: requests stay queued
    with serve(e, max_waiting_requests=2) as srv, ThreadPoolExecutor(2) as pool:
        try:
            held = [pool.submit(srv.call, "POST", "/v1/discover", {"request": t}) for t in TEXTS[:2]]
            wait_for(lambda: srv.state.engine_thread.in_flight == 2, what="two queued requests")
            status, headers, body = srv.call("POST", "/v1/discover", {"request": TEXTS[2]})
            assert_error(status, body, 429, "queue_full")
            assert int(headers["Retry-After"]) >= 1 and body["error"]["details"]["max_waiting"] == 2
        finally:
            e.generator.gate.set()
        for text, f in zip(TEXTS, held):
            status, _, body = f.result(30)
            assert status == 200 and body["token_ids"] == solo[text].token_ids
        assert metric(srv.call("GET", "/metrics")[2], "requests_rejected_total", reason="queue_full") == 1


def test_a_client_that_disconnects_is_aborted_and_its_pages_freed(engine):
    e = paced(engine, delay=0.1)
    kv = engine.generator.kv
    with serve(e) as srv:
        body = json.dumps({"request": TEXTS[3]}).encode()
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.sendall(b"POST /v1/discover HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: srv.state.engine_thread.running == 1, what="the request running")
        assert kv.pages_in_use > 0
        sock.close()
        wait_for(lambda: srv.state.engine_thread.in_flight == 0 and kv.pages_in_use == 0, what="pages freed")
        wait_for(lambda: metric(srv.call("GET", "/metrics")[2], "requests_rejected_total", reason="request_aborted")
                 == 1, what="the abort counted")
        assert metric(srv.call("GET", "/metrics")[2], "request_success_total") == 0


def test_a_request_past_its_deadline_is_504_and_frees_its_pages(engine):
    e = paced(engine, delay=0.25)
    kv = engine.generator.kv
    with serve(e, request_timeout_s=0.15) as srv:
        status, _, body = srv.call("POST", "/v1/discover", {"request": TEXTS[4]})
        assert_error(status, body, 504, "deadline_exceeded")
        status, _, body = srv.call("POST", "/v1/discover", {"request": TEXTS[4], "timeout_s": 0.1})  # the least
        assert_error(status, body, 504, "deadline_exceeded")
        wait_for(lambda: kv.pages_in_use == 0, what="pages freed")
        status, _, body = srv.call("POST", "/v1/discover", {"request": TEXTS[4], "timeout_s": 30})
        assert status == 200


def test_health_is_503_while_loading_and_while_draining(engine):
    release = threading.Event()

    def slow_load():
        release.wait(20)
        return paced(engine)

    srv = LiveServer(ServeState(slow_load, ServeConfig(lanes=1)), wait_ready=False)  # the paced stand-in as given
    try:
        for path in ("/health", "/health/ready"):
            status, headers, body = srv.call("GET", path)
            assert_error(status, body, 503, "draining")
            assert body["error"]["details"]["phase"] == "loading" and "Retry-After" in headers
        assert srv.call("GET", "/health/live")[0] == 200
        assert_error(*srv.call("POST", "/v1/discover", {"request": "x"})[::2], 503, "draining")
        release.set()
        wait_for(lambda: srv.call("GET", "/health")[0] == 200, what="ready")
        gen = srv.state.engine.generator
        gen.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            admitted = pool.submit(srv.call, "POST", "/v1/discover", {"request": TEXTS[0]})
            wait_for(lambda: srv.state.engine_thread.in_flight == 1, what="an admitted request")
            srv.state.begin_drain()
            status, _, body = srv.call("GET", "/health")
            assert_error(status, body, 503, "draining") and body["error"]["details"]["phase"] == "draining"
            assert_error(*srv.call("POST", "/v1/discover", {"request": "x"})[::2], 503, "draining")
            assert not srv.state.drained
            gen.gate.set()
            assert admitted.result(30)[0] == 200  # admitted before the drain: answered
        wait_for(lambda: srv.state.drained, what="drained")
    finally:
        release.set()
        srv.close()


def test_the_noop_engine_answers_through_the_same_loop(tiny_bundle):
    """bench/serve_burst.py's ceiling: the server with bench/noop_engine.py's engine answers every request, empty."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from noop_engine import load_noop
    with serve(load_noop(tiny_bundle)) as srv:
        for text in TEXTS[:3]:
            status, _, body = srv.call("POST", "/v1/discover", {"request": text})
            assert status == 200 and body["tools"] == [] and body["prompt_token_ids"], body


def test_a_bound_server_freezes_the_loaded_objects_and_steps_in_lanes(tiny_bundle):
    """Full collections hold the GIL while they walk every tracked object (the engine thread stands still):
    what is alive once the engine is loaded leaves the collector's view, and full collections are rarer.
    On 2+ CPUs the fast CPU engine steps in 2 lanes of 1 kernel thread (runtime/batching/lanes.py); with --lanes 1
    its kernel threads follow the spare CPU, the event loop's own time left out."""
    import gc

    from toolcall.runtime.batching.lanes import Lanes
    from toolcall.runtime.bundle.machine import available_cpus
    from toolcall.runtime.serve.state import FULL_COLLECTION_AFTER

    threshold = gc.get_threshold()
    engine = Engine.load(tiny_bundle, threads=1)  # as `runtime serve` loads it on 2 CPUs
    spare_core = len(os.sched_getaffinity(0)) == available_cpus() > 1  # no quota, a core to add
    try:
        with serve(engine) as srv:
            assert gc.get_freeze_count() > 0 and gc.get_threshold()[2] == FULL_COLLECTION_AFTER
            gen = srv.state.engine_thread.generator
            if available_cpus() > 1:
                assert isinstance(gen, Lanes) and len(gen.lanes) == 2 and srv.state.kernel_threads is None
                assert all(lane.model.threads == available_cpus() // 2 for lane in gen.lanes)
            assert srv.call("POST", "/v1/discover", {"request": TEXTS[0]})[0] == 200
        with serve(Engine.load(tiny_bundle, threads=1), lanes=1) as srv:
            kt = srv.state.kernel_threads
            if spare_core:
                assert kt is not None and (kt.base, kt.loop_thread) == (1, srv.thread.native_id)
            else:
                assert kt is None
            assert srv.call("POST", "/v1/discover", {"request": TEXTS[0]})[0] == 200
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
