"""The official `openai` client against `runtime serve` (127.0.0.1, in-process) on the shipped tool model:
streamed and non-streamed calls give the same answer, tool_choice in its four forms and parallel_tool_calls
bind through the grammar, max tokens cap the answer, a tool loop ends, models are listed and retrieved by
every served name, and fields the server cannot honour are refused naming them."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_serve import LiveServer  # noqa: E402

from toolcall.runtime.engine import Engine  # noqa: E402
from toolcall.runtime.serve.state import ServeConfig, ServeState  # noqa: E402

MULTI = "Convert 100 dollars to euros and then book a taxi to the airport"  # the shipped model names two tools
CHAT = "thanks a lot, bye"  # and none here
NAMES = ("tool-finder", "tool-finder-v1")


@pytest.fixture(scope="module")
def server(shipped_bundle):
    engine = Engine.load(shipped_bundle)
    srv = LiveServer(ServeState(lambda: engine, ServeConfig(served_model_names=NAMES, lanes=1)))
    yield srv, engine
    srv.close()


@pytest.fixture(scope="module")
def client(server):
    srv, _ = server
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, text=MULTI, model=NAMES[0], **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **kw)


def names(completion) -> list[str]:
    return [c.function.name for c in completion.choices[0].message.tool_calls or []]


def test_streaming_gives_what_the_plain_call_gives(client):
    plain = ask(client)
    assert len(names(plain)) == 2 and plain.choices[0].finish_reason == "tool_calls"
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage == plain.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    with client.chat.completions.stream(model=NAMES[0], messages=[{"role": "user", "content": MULTI}]) as stream:
        final = stream.get_final_completion()
    assert names(final) == names(plain) and final.model == NAMES[0]
    assert [c.function.arguments for c in final.choices[0].message.tool_calls] == ["{}", "{}"]
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_choice_in_its_four_forms_and_one_call_at_most(client, server):
    _, engine = server
    assert names(ask(client, CHAT)) == [] and ask(client, CHAT).choices[0].finish_reason == "stop"
    none = ask(client, tool_choice="none")
    assert names(none) == [] and none.choices[0].finish_reason == "stop"
    assert names(ask(client, tool_choice="auto")) == names(ask(client))
    required = ask(client, CHAT, tool_choice="required")
    assert len(names(required)) >= 1 and required.choices[0].finish_reason == "tool_calls"
    target = engine.grammar.tool_names[5]
    named = ask(client, CHAT, tool_choice={"type": "function", "function": {"name": target}})
    assert names(named) == [target]
    assert len(names(ask(client, parallel_tool_calls=False))) == 1
    with pytest.raises(openai.BadRequestError) as e:  # a named function outside the request's own tools
        ask(client, tools=[{"type": "function", "function": {"name": engine.grammar.tool_names[0]}}],
            tool_choice={"type": "function", "function": {"name": target}})
    assert e.value.body["code"] == "request_invalid" and e.value.body["details"]["field"] == "tool_choice"


def test_max_tokens_cap_the_answer_and_are_validated(client):
    full = ask(client)
    for field in ("max_tokens", "max_completion_tokens"):
        cut = ask(client, **{field: 2})
        assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 2
        assert names(cut) == []  # two tokens name no whole tool yet
        for bad in (0, -5):
            with pytest.raises(openai.BadRequestError) as e:
                ask(client, **{field: bad})
            assert e.value.body["code"] == "request_invalid" and field in e.value.body["message"]
    assert full.usage.completion_tokens > 2


def test_a_tool_loop_ends(client):
    first = ask(client)
    calls = first.choices[0].message.tool_calls
    messages = [{"role": "user", "content": MULTI}, first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "done"} for c in calls]
    after = client.chat.completions.create(model=NAMES[0], messages=messages)
    assert names(after) == [] and after.choices[0].finish_reason == "stop"
    again = client.chat.completions.create(model=NAMES[0], messages=messages + [
        {"role": "assistant", "content": "Both are done."}, {"role": "user", "content": "Call my mom"}])
    assert names(again) == ["make_phone_call"]


def test_models_are_listed_and_retrieved_by_every_served_name(client, server):
    _, engine = server
    assert [m.id for m in client.models.list().data] == list(NAMES)
    for name in (*NAMES, engine.contract.engine.bundle_id):
        assert client.models.retrieve(name).id == name
        assert ask(client, model=name).model == name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(engine.folder.name)  # served names given: the folder's is not one
    with pytest.raises(openai.NotFoundError):
        ask(client, model="gpt-4o")


@pytest.mark.parametrize("field, value", [("n", 2), ("logprobs", True), ("top_logprobs", 3), ("stop", ["\n"]),
                                          ("presence_penalty", 0.5), ("logit_bias", {"5": 1.0}),
                                          ("response_format", {"type": "json_object"})])
def test_fields_the_server_cannot_honour_are_refused_by_name(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, **{field: value})
    assert e.value.body["code"] == "request_invalid" and field in e.value.body["message"]


def test_an_unknown_field_is_refused_not_ignored(client):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, extra_body={"guided_json": {"type": "object"}})
    assert "guided_json" in e.value.body["message"]


def test_the_readmes_tool_loop_ends(server):
    """README's "Serving" example, run against this server (its model name served under the README's)."""
    import re
    import threading
    from pathlib import Path
    srv, engine = server
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "tool_call_id" in block]
    code = code.replace("http://127.0.0.1:8000/v1", f"http://127.0.0.1:{srv.port}/v1")
    code = code.replace('model="toolcall-cpu"', f'model="{engine.contract.engine.bundle_id}"')
    scope: dict = {}
    runner = threading.Thread(target=exec, args=(code, scope), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the README's loop did not end"
    tools = [m for m in scope["messages"] if m["role"] == "tool"]
    assert len(tools) == 2 and scope["reply"].finish_reason == "stop"
