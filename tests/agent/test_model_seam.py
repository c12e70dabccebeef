"""``Agent(model=...)`` takes a ``Model``: the run loop calls it instead of litellm.

A tiny in-process model, no litellm call, served over gRPC like any agent: it sees the
conversation and the tools, its text streams as ``text_delta``s, its usage is the
session's, and its ``model_name`` is what the hooks (tracing, metrics) report. The
environment's ``HELIX_MODEL`` names a litellm model: it does not replace a model object.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport import AgentClient, create_server
from helix_transport._events import SessionStatus
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NoHooks, RunHooks
from helix_transport.agent.model import Model, ModelResponse, ToolCall
from helix_transport.agent.tools import FINISH_TOOL
from helix_transport.store import SessionRecord, Usage
from helix_transport.store.memory import MemoryStore


class _Question(BaseModel):
    text: str


class _Answer(BaseModel):
    answer: str


@dataclass
class EchoModel:
    """Answers with the question, upper-cased, through the finish tool."""

    model_name: str = "in-process/echo"
    seen: list[list[dict[str, Any]]] = field(default_factory=list)
    tool_names: list[str] = field(default_factory=list)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        on_text: Callable[[str], None],
        settings: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ModelResponse:
        self.seen.append(list(messages))
        self.tool_names = [t["function"]["name"] for t in tools]
        question = _Question.model_validate_json(messages[-1]["content"])
        on_text("thinking")
        call = ToolCall(
            id="call_echo",
            name=FINISH_TOOL,
            arguments_json=json.dumps({"answer": question.text.upper()}),
        )
        return ModelResponse(
            text="thinking",
            tool_calls=[call],
            usage=Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10),
            provider="in-process",
        )


class _Generations(NoHooks):
    """Records the model name each generation hook is given."""

    def __init__(self, into: list[tuple[str, str]]) -> None:
        self.into = into

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        self.into.append(("start", model))

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        self.into.append(("end", model))


def test_the_echo_model_is_a_model() -> None:
    model: Model = EchoModel()  # mypy holds the protocol to it
    assert model.model_name == "in-process/echo"


async def test_a_model_object_answers_an_agent_served_over_grpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Set, it would replace a model *name*; a model object is the one called.
    monkeypatch.setenv("HELIX_MODEL", "scripted/nothing-registered")
    model = EchoModel()
    echo = Agent(
        name="echo",
        description="Echoes the question, louder.",
        input_model=_Question,
        output_model=_Answer,
        system_prompt="Echo.",
        model=model,
    )
    assert echo.resolved_model() == "in-process/echo"
    generations: list[tuple[str, str]] = []

    def hooks(agent: Agent, record: SessionRecord) -> RunHooks:
        return _Generations(generations)

    async with (
        await create_server(echo, MemoryStore(), allow_unauthenticated=True, hooks=hooks) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(_Question(text="hi there").model_dump_json(), session_id="s1")
        status = await client.wait("s1")
        events = [e async for e in client.stream("s1")]

    assert SessionStatus.from_proto(status.status) is SessionStatus.COMPLETED
    assert json.loads(status.output_json) == {"answer": "HI THERE"}
    assert status.usage.total_tokens == 10
    assert [m["role"] for m in model.seen[0]] == ["system", "user"]
    assert model.tool_names == [FINISH_TOOL]
    deltas = [e.text_delta.text for e in events if e.WhichOneof("payload") == "text_delta"]
    assert deltas == ["thinking"]
    assert generations == [("start", "in-process/echo"), ("end", "in-process/echo")]


def test_a_model_name_still_means_litellm() -> None:
    named = Agent(
        name="named",
        description="d",
        input_model=_Question,
        output_model=_Answer,
        model="scripted/anything",
    )
    assert named.plugged_model() is None
    assert named.resolved_model() == "scripted/anything"
