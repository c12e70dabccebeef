"""The scripted model through litellm's real streaming path, as the run loop calls it."""

from __future__ import annotations

import litellm

from helix_transport.agent import scripted
from helix_transport.agent.litellm import stream_completion

MODEL = scripted.register_script(
    "test-model",
    lambda messages: scripted.ScriptedTurn(
        text="hello world", tool_calls=(scripted.call("x", a=1),)
    ),
)


async def test_stream_completion_assembles_text_tool_calls_and_usage() -> None:
    texts: list[str] = []
    response = await stream_completion(
        model=MODEL,
        messages=[{"role": "user", "content": "{}"}],
        tools=[],
        on_text=texts.append,
    )
    assert "".join(texts) == response.text == "hello world"
    assert [(c.name, c.arguments_json) for c in response.tool_calls] == [("x", '{"a": 1}')]
    assert response.usage.total_tokens == response.usage.prompt_tokens + 4 > 4


async def test_scripted_usage_reports_its_zero_cost() -> None:
    # A provider that reports its cost spares litellm from pricing the stream again
    # (four cost computations per call became one).
    stream = await litellm.acompletion(
        model=MODEL,
        messages=[{"role": "user", "content": "{}"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    costs = [chunk.usage.cost async for chunk in stream if getattr(chunk, "usage", None)]
    assert costs == [0.0]


async def test_tool_calls_sent_without_ids_get_ids_of_their_own() -> None:
    # Child sessions are named after their tool call: `call_0` in two steps (the old
    # fallback) made the second step's delegation rejoin the first's child.
    nameless = scripted.register_script(
        "test-model-no-ids",
        lambda messages: scripted.ScriptedTurn(
            tool_calls=(scripted.ScriptedToolCall(name="x", with_id=False),)
        ),
    )
    ids = []
    for _ in range(2):
        response = await stream_completion(
            model=nameless, messages=[{"role": "user", "content": "{}"}], tools=[], on_text=print
        )
        ids += [c.id for c in response.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids), ids
