"""The table of event kinds (``helix_transport._events.EVENT_KINDS``): a row for every
payload the contract has, and every row's summary is what both the CLI's printer and
the inspector page show. A payload added to the proto without a row fails here."""

from __future__ import annotations

import io

import pytest
from google.protobuf.message import Message

from helix_transport._events import (
    EVENT_KINDS,
    TERMINAL_KINDS,
    SessionStatus,
    Tone,
    event_kind,
    is_terminal,
    summarize,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli import EventPrinter
from helix_transport.cli.inspector.app import event_kinds_json
from helix_transport.cli.inspector.feed import event_json

PAYLOADS = [field.name for field in pb.StreamEvent.DESCRIPTOR.oneofs_by_name["payload"].fields]
"""Every payload of ``StreamEvent``, from the generated descriptor (so from the proto)."""


def _sample_payloads() -> dict[str, Message]:
    child = pb.StreamEvent(
        session_id="root-remote-call_1_0-0123456789abcdef", agent_type="researcher", sequence=4
    )
    child.tool_start.CopyFrom(pb.ToolStart(tool_name="search", arguments_json='{"q": "x"}'))
    return {
        "run_started": pb.RunStarted(input_json='{"question": "why"}'),
        "step_started": pb.StepStarted(),
        "text_delta": pb.TextDelta(text="Looking it up."),
        "tool_start": pb.ToolStart(tool_name="search", arguments_json='{"q": "x"}'),
        "tool_end": pb.ToolEnd(tool_name="search", result_json='{"hits": 2}', is_error=True),
        "subagent_start": pb.SubagentStart(child_agent_type="researcher", child_session_id="c1"),
        "subagent_end": pb.SubagentEnd(
            child_agent_type="researcher", status=pb.SESSION_STATUS_COMPLETED
        ),
        "output": pb.Output(output_json='{"answer": 42}'),
        "error": pb.Error(message="the model timed out; retrying"),
        "interrupted": pb.Interrupted(reason="enough"),
        "completed": pb.Completed(output_json='{"answer": 42}'),
        "failed": pb.Failed(error="no answer", failure_reason="max_steps"),
        "run_resumed": pb.RunResumed(step=3, reason="lease_expired"),
        "terminated": pb.Terminated(reason="aborted"),
        "child_event": pb.ChildEvent(tool_call_id="call_1_0", event=child),
        "turn_started": pb.TurnStarted(turn=2, message="and then?"),
        "input_required": pb.InputRequired(
            request_id="call_7",
            tool_name="send",
            arguments_json='{"to": "ops"}',
            kind=pb.INPUT_KIND_APPROVAL,
        ),
        "input_answered": pb.InputAnswered(
            request_id="call_7", outcome=pb.INPUT_OUTCOME_DENIED, reason="not today"
        ),
        "suspended": pb.Suspended(request_ids=["call_7"]),
        "close_policy_applied": pb.ClosePolicyApplied(
            child_session_id="root-agent-critic-0123456789abcdef",
            child_agent_type="critic",
            policy=pb.CLOSE_POLICY_TERMINATE,
            action=pb.CLOSE_ACTION_TERMINATED,
            reason="parent root completed",
            undelivered_messages=2,
        ),
    }


def one_of_each() -> list[pb.StreamEvent]:
    """One event of every kind the proto has, numbered 1, 2, 3... in one root session."""
    samples = _sample_payloads()
    events = []
    for sequence, name in enumerate(PAYLOADS, 1):
        event = pb.StreamEvent(
            session_id="root", agent_type="orchestrator", sequence=sequence, step=2
        )
        event.time.FromSeconds(1_700_000_000 + sequence)
        getattr(event, name).CopyFrom(samples[name])
        events.append(event)
    return events


def test_every_payload_of_the_proto_has_a_row_and_no_row_is_left_over() -> None:
    assert PAYLOADS, "no payload oneof in StreamEvent"
    missing = [name for name in PAYLOADS if name not in EVENT_KINDS]
    assert missing == [], f"payloads without a row in EVENT_KINDS: {missing}"
    assert sorted(EVENT_KINDS) == sorted(PAYLOADS)
    assert all(name == row.name for name, row in EVENT_KINDS.items())
    assert sorted(_sample_payloads()) == sorted(PAYLOADS)  # this test shows each of them


def test_terminal_kinds_are_those_that_imply_a_final_status() -> None:
    assert {"completed", "failed", "interrupted", "terminated"} == TERMINAL_KINDS
    for row in EVENT_KINDS.values():
        final = row.status is not None and row.status.is_terminal
        assert row.terminal == final, row.name
    assert EVENT_KINDS["suspended"].status is SessionStatus.SUSPENDED
    assert {e.WhichOneof("payload") for e in one_of_each() if is_terminal(e)} == TERMINAL_KINDS


@pytest.mark.parametrize("event", one_of_each(), ids=lambda e: e.WhichOneof("payload"))
def test_every_kind_has_a_summary_the_printer_prints_and_the_page_gets(
    event: pb.StreamEvent,
) -> None:
    name = event.WhichOneof("payload")
    summary = summarize(event)
    assert summary.lead.strip(), f"{name}: an empty summary"
    assert str(summary) != "(unknown event)"

    out = io.StringIO()
    printer = EventPrinter(out, color=False)
    printer.print(event)
    printer.close()
    assert str(summary) in out.getvalue(), out.getvalue()

    sent = event_json("root", event)
    assert sent["kind"] == name and sent["event"]["sequence"] == event.sequence
    assert sent["summary"] == {"lead": summary.lead, "rest": summary.rest, "tone": summary.tone}


def test_the_printer_colours_a_summarys_lead_by_its_tone() -> None:
    asked = next(e for e in one_of_each() if e.WhichOneof("payload") == "input_required")
    out = io.StringIO()
    EventPrinter(out, color=True).print(asked)
    summary = summarize(asked)
    assert summary.tone is Tone.ASK
    assert f"\x1b[35m{summary.lead}\x1b[0m{summary.rest}\n" in out.getvalue()
    assert summary.lead == "? approval needed"
    assert summary.rest == ' for send({"to": "ops"}) [call_7]'


def test_a_payload_this_code_does_not_know_is_an_unknown_event() -> None:
    newer = pb.StreamEvent(session_id="root", sequence=9)  # a payload past ours: none set
    assert event_kind(newer).name == "" and not event_kind(newer).terminal
    assert str(summarize(newer)) == "(unknown event)"
    assert event_json("root", newer)["kind"] == "unknown"


def test_the_page_gets_the_table_from_the_server() -> None:
    table = event_kinds_json()
    assert [kind["name"] for kind in table["kinds"]] == list(EVENT_KINDS)
    assert {kind["name"] for kind in table["kinds"] if kind["terminal"]} == TERMINAL_KINDS
    assert table["statuses"] == [status.value for status in SessionStatus]
    assert set(table["tones"]) == {tone.value for tone in Tone} - {""}
