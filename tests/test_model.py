"""The scripted model through litellm's real streaming path, as the run loop calls it."""

from __future__ import annotations

import litellm

from helix_transport.agent import scripted
from helix_transport.agent.model import stream_completion

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
