"""``--json``'s rendering of protobuf messages: plain JSON values, field by field."""

from __future__ import annotations

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.jsonout import message_json


def test_numbers_parsed_json_statuses_and_times() -> None:
    status = pb.GetStatusResponse(
        session_id="s", status=pb.SESSION_STATUS_INTERRUPTED, last_sequence=2**40,
        output_json='{"a": [1, 2]}', error="",
    )  # fmt: skip
    status.created_at.FromJsonString("2026-11-26T10:00:00.5Z")
    shown = message_json(status)
    assert shown["last_sequence"] == 2**40 and shown["status"] == "interrupted"
    assert shown["output"] == {"a": [1, 2]} and "output_json" not in shown
    assert shown["created_at"] == "2026-11-26T10:00:00.500000Z" and shown["finished_at"] is None
    assert shown["usage"] == {
        "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cost_usd": 0.0,
    }  # fmt: skip


def test_a_oneof_shows_its_member_maps_and_nested_events() -> None:
    inner = pb.StreamEvent(
        sequence=1, run_started=pb.RunStarted(input_json="{}", metadata={"k": "v"})
    )
    event = pb.StreamEvent(sequence=7, child_event=pb.ChildEvent(tool_call_id="c", event=inner))
    shown = message_json(event)
    assert "completed" not in shown and shown["time"] is None
    started = shown["child_event"]["event"]["run_started"]
    assert started == {"input": {}, "parent_session_id": "", "metadata": {"k": "v"}}


def test_text_that_is_not_json_stays_text_under_its_own_name() -> None:
    # A foreign service that broke the contract: shown as it came, not dropped.
    shown = message_json(pb.Completed(output_json="not json"))
    assert shown["output_json"] == "not json" and "output" not in shown
    assert message_json(pb.Completed())["output"] is None
    unknown = pb.GetStatusResponse()
    unknown.status = 42  # type: ignore[assignment]  # a status from a newer contract
    assert message_json(unknown)["status"] == "42"
