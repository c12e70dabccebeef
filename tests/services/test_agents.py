"""The mesh's agents, each served in-process and driven over real gRPC with the raw stub."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest
from pydantic import BaseModel

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.definition import Agent
from helix_transport.agent.scripted import ScriptedTurn
from helix_transport.agent.tools import FINISH_TOOL, ToolContext
from helix_transport.server import create_server
from helix_transport.server.app import load_agent
from helix_transport.store import MemoryStore
from services.mailer import agent as mailer
from services.mailer.agent import MailRequest, MailResult
from services.orchestrator import agent as orchestrator
from services.orchestrator.agent import Answer, Question
from services.orchestrator.agent import script as orchestrator_script
from services.researcher import agent as researcher
from services.researcher.agent import (
    NOTES,
    FetchNoteArgs,
    NoteNotFound,
    ResearchInput,
    ResearchOutput,
    fetch_note,
)
from services.researcher.agent import script as researcher_script
from services.summarizer import agent as summarizer
from services.summarizer.agent import SummarizeInput, Summary, count_words_in
from services.summarizer.agent import script as summarizer_script

TIMEOUT_S = 30.0


@asynccontextmanager
async def serving(agent: Agent) -> AsyncIterator[pb_grpc.AgentServiceAsyncStub]:
    """``agent`` served on a fresh memory store; a raw stub dialing it."""
    server = await create_server(agent, MemoryStore(), allow_unauthenticated=True)
    async with server, grpc.aio.insecure_channel(server.address) as channel:
        yield pb_grpc.AgentServiceStub(channel)


async def run(
    stub: pb_grpc.AgentServiceAsyncStub, session_id: str, payload: dict[str, Any]
) -> tuple[list[pb.StreamEvent], dict[str, Any]]:
    """Start a session, stream it to its end; its events and its parsed output."""
    started = await stub.Start(
        pb.StartRequest(session_id=session_id, input_json=json.dumps(payload)), timeout=TIMEOUT_S
    )
    assert started.created
    events = [
        event
        async for response in stub.Stream(
            pb.StreamRequest(session_id=session_id), timeout=TIMEOUT_S
        )
        for event in response.events
    ]
    status = await stub.GetStatus(pb.GetStatusRequest(session_id=session_id), timeout=TIMEOUT_S)
    assert status.status == pb.SESSION_STATUS_COMPLETED, (status.error, status.failure_reason)
    assert_log(events, session_id=session_id, last_sequence=status.last_sequence)
    assert events[-1].completed.output_json == status.output_json
    return events, json.loads(status.output_json)


def assert_log(events: list[pb.StreamEvent], *, session_id: str, last_sequence: int) -> None:
    """Sequences 1..N with no gap, one session, ending in ``completed``."""
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert len(events) == last_sequence
    assert {e.session_id for e in events} == {session_id}
    assert events[0].WhichOneof("payload") == "run_started"
    assert events[-1].WhichOneof("payload") == "completed"


def tool_starts(events: list[pb.StreamEvent], name: str) -> list[pb.StreamEvent]:
    return [
        e
        for e in events
        if e.WhichOneof("payload") == "tool_start" and e.tool_start.tool_name == name
    ]


def tool_ends(events: list[pb.StreamEvent], name: str) -> list[pb.StreamEvent]:
    return [
        e for e in events if e.WhichOneof("payload") == "tool_end" and e.tool_end.tool_name == name
    ]


def text_of_step(events: list[pb.StreamEvent], step: int) -> str:
    return "".join(e.text_delta.text for e in events if e.step == step and e.HasField("text_delta"))


def finished_with(turn: ScriptedTurn) -> dict[str, Any]:
    """The output a scripted turn finishes with (fails if it does not finish)."""
    calls = [c for c in turn.tool_calls if c.name == FINISH_TOOL]
    assert len(calls) == 1, turn
    return calls[0].arguments


def conversation(payload: dict[str, Any], *steps: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as the loop builds it: each step an assistant turn, then its tool results."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "..."},
        {"role": "user", "content": json.dumps(payload)},
    ]
    for number, results in enumerate(steps, 1):
        ids = [f"call_{number}_{i}" for i in range(len(results))]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}}
                    for i, (name, _) in zip(ids, results, strict=True)
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": i, "name": name, "content": json.dumps(result)}
            for i, (name, result) in zip(ids, results, strict=True)
        )
    return messages


# -- researcher ---------------------------------------------------------------------------


async def test_researcher_reads_the_best_notes_for_its_topic() -> None:
    async with serving(researcher) as stub:
        events, output = await run(stub, "r-1", {"topic": "event log sequence", "max_sources": 2})

    # The two notes sharing most terms with the topic, ties broken by id.
    expected = ["event-log-replay", "event-sourcing"]
    assert output == {
        "topic": "event log sequence",
        "findings": [f"{NOTES[i].title}: {NOTES[i].text}" for i in expected],
        "sources": expected,
    }
    (search,) = tool_starts(events, "search_notes")
    assert search.step == 1
    assert json.loads(search.tool_start.arguments_json) == {
        "query": "event log sequence",
        "limit": 2,
    }
    assert "Searching my notes for 'event log sequence'" in text_of_step(events, 1)
    # Both fetches were asked for in one model turn, so they share a step.
    fetches = tool_starts(events, "fetch_note")
    assert sorted(json.loads(e.tool_start.arguments_json)["note_id"] for e in fetches) == expected
    assert {e.step for e in fetches} == {2}
    ends = tool_ends(events, "fetch_note")
    assert {e.tool_end.tool_call_id for e in ends} == {e.tool_start.tool_call_id for e in fetches}
    assert not any(e.tool_end.is_error for e in ends)
    assert {e.step for e in events if e.HasField("step_started")} == {1, 2, 3}


async def test_researcher_with_no_matching_notes_finishes_empty() -> None:
    async with serving(researcher) as stub:
        events, output = await run(stub, "r-2", {"topic": "zebra migration"})

    assert output == {"topic": "zebra migration", "findings": [], "sources": []}
    assert tool_starts(events, "fetch_note") == []
    assert "nothing on 'zebra migration'" in text_of_step(events, 2)


async def test_fetch_note_names_an_unknown_id() -> None:
    # The notes tools never look at their context.
    ctx = cast(ToolContext, SimpleNamespace())
    with pytest.raises(NoteNotFound, match="no note with id 'nope'"):
        await fetch_note.fn(ctx, FetchNoteArgs(note_id="nope"))
    note = await fetch_note.fn(ctx, FetchNoteArgs(note_id="backoff"))
    assert note == {"id": "backoff", "title": NOTES["backoff"].title, "text": NOTES["backoff"].text}


def test_researcher_script_finishes_with_the_notes_it_could_fetch() -> None:
    hits = [{"id": "backoff", "title": "x", "score": 2}, {"id": "gone", "title": "y", "score": 1}]
    messages = conversation(
        {"topic": "backoff"},
        [("search_notes", {"query": "backoff", "hits": hits})],
        [
            ("fetch_note", {"id": "backoff", "title": "Exponential backoff", "text": "Wait."}),
            ("fetch_note", {"error": "NoteNotFound: no note with id 'gone'"}),
        ],
    )
    turn = researcher_script(messages)
    assert finished_with(turn) == {
        "topic": "backoff",
        "findings": ["Exponential backoff: Wait."],
        "sources": ["backoff"],
    }
    assert researcher_script(messages) == turn  # a pure function of the conversation


def test_researcher_script_finishes_when_search_fails() -> None:
    messages = conversation({"topic": "x"}, [("search_notes", {"error": "boom"})])
    assert finished_with(researcher_script(messages)) == {
        "topic": "x",
        "findings": [],
        "sources": [],
    }


# -- summarizer ---------------------------------------------------------------------------

TEXT = (
    "The mesh runs each agent as its own gRPC service. "
    "Sessions are logged as events with gapless sequences! "
    "Can a reader resume after a crash?   It can, by replaying from the last sequence it saw."
)


async def test_summarizer_keeps_the_first_sentences_and_counts_every_word() -> None:
    async with serving(summarizer) as stub:
        events, output = await run(stub, "s-1", {"text": TEXT, "max_sentences": 2})

    assert output == {
        "summary": "The mesh runs each agent as its own gRPC service. "
        "Sessions are logged as events with gapless sequences!",
        "key_points": [
            "The mesh runs each agent as its own gRPC service",
            "Sessions are logged as events with gapless sequences",
        ],
        "word_count": 35,
    }
    assert output["word_count"] == len(TEXT.split())
    starts = tool_starts(events, "count_words") + tool_starts(events, "split_sentences")
    assert [e.step for e in starts] == [1, 1]
    ends = tool_ends(events, "split_sentences")
    assert len(json.loads(ends[0].tool_end.result_json)["sentences"]) == 4


async def test_summarizer_default_keeps_three_sentences() -> None:
    async with serving(summarizer) as stub:
        _, output = await run(stub, "s-2", {"text": TEXT})

    assert output["summary"].endswith("Can a reader resume after a crash?")
    assert len(output["key_points"]) == 3


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"text": "Hello.", "max_sentences": 0}, "input_json.max_sentences"),
        ({"text": "Hello.", "max_sentences": 11}, "input_json.max_sentences"),
        ({"text": ""}, "input_json.text"),
    ],
)
async def test_summarizer_rejects_invalid_input(payload: dict[str, Any], field: str) -> None:
    async with serving(summarizer) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Start(pb.StartRequest(input_json=json.dumps(payload)), timeout=TIMEOUT_S)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(f"{field}:")


def test_summarizer_script_survives_failed_tools() -> None:
    messages = conversation(
        {"text": "One two. Three four five.", "max_sentences": 1},
        [("count_words", {"error": "boom"}), ("split_sentences", {"error": "boom"})],
    )
    assert finished_with(summarizer_script(messages)) == {
        "summary": "One two.",
        "key_points": ["One two"],
        "word_count": 5,
    }


def test_word_count_ignores_lone_punctuation() -> None:
    assert count_words_in("It can - it does — fine.") == 5


# -- orchestrator -------------------------------------------------------------------------


async def test_orchestrator_delegates_research_and_summary_over_grpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    question = "What is gRPC and why does the mesh keep an event log?"
    research = await create_server(researcher, MemoryStore(), allow_unauthenticated=True)
    summarize = await create_server(summarizer, MemoryStore(), allow_unauthenticated=True)
    async with research, summarize:
        monkeypatch.setenv("HELIX_AGENT_ADDRESS_RESEARCHER", research.address)
        monkeypatch.setenv("HELIX_AGENT_ADDRESS_SUMMARIZER", summarize.address)
        async with serving(orchestrator) as stub:
            events, output = await run(stub, "o-1", {"question": question})

    starts = [e.subagent_start for e in events if e.WhichOneof("payload") == "subagent_start"]
    assert [s.child_agent_type for s in starts] == ["researcher", "researcher", "summarizer"]
    (plan,) = tool_ends(events, "plan")
    parts = json.loads(plan.tool_end.result_json)["sub_questions"]
    assert parts == ["What is gRPC?", "Why does the mesh keep an event log?"]
    # The two research calls ran concurrently and may end in any order: sort by call id.
    researched = [
        json.loads(end.output_json)
        for end in sorted(
            (e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"),
            key=lambda end: end.tool_call_id,
        )
        if end.child_agent_type == "researcher"
    ]
    assert output["findings"] == [f for r in researched for f in r["findings"]]
    assert output["findings"], "the researcher found nothing in its corpus"
    summary = next(
        json.loads(e.subagent_end.output_json)
        for e in events
        if e.WhichOneof("payload") == "subagent_end"
        and e.subagent_end.child_agent_type == "summarizer"
    )
    assert output["answer"] == summary["summary"]


def test_orchestrator_script_researches_the_whole_question_when_plan_fails() -> None:
    messages = conversation({"question": "Why?"}, [("plan", {"error": "boom"})])
    turn = orchestrator_script(messages)
    assert [(c.name, c.arguments["topic"]) for c in turn.tool_calls] == [("research", "Why?")]


# -- every agent --------------------------------------------------------------------------

AGENTS = [
    (researcher, ResearchInput, ResearchOutput, ["search_notes", "fetch_note"]),
    (summarizer, SummarizeInput, Summary, ["count_words", "split_sentences"]),
    (orchestrator, Question, Answer, ["plan", "research", "summarize", "email"]),
    (mailer, MailRequest, MailResult, ["send_email"]),
]


@pytest.mark.parametrize(("agent", "input_model", "output_model", "tools"), AGENTS)
async def test_describe_reports_the_agents_schemas(
    agent: Agent, input_model: type[BaseModel], output_model: type[BaseModel], tools: list[str]
) -> None:
    async with serving(agent) as stub:
        described = await stub.Describe(pb.DescribeRequest(), timeout=TIMEOUT_S)

    assert described.agent_type == agent.name
    assert described.description == agent.description
    assert json.loads(described.input_schema_json) == input_model.model_json_schema()
    assert json.loads(described.output_schema_json) == output_model.model_json_schema()
    assert list(described.tool_names) == tools


@pytest.mark.parametrize("name", ["researcher", "summarizer", "orchestrator", "mailer"])
def test_service_reference_loads_the_agent(name: str) -> None:
    agent = load_agent(f"services.{name}:agent")
    assert agent.name == name
    assert agent.model == f"scripted/{name}"
    assert agent.system_prompt
