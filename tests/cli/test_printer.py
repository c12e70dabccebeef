"""What a person at a terminal sees: the printer of ``helix-mesh call`` and ``make demo``
(two children that stream at once never share a line, and siblings of one type are told
apart), and a server that cannot listen."""

from __future__ import annotations

import io
import socket

import pytest
from google.protobuf.message import Message

from helix_transport import ServerConfig, UsageError, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.cli import EventPrinter
from helix_transport.store import MemoryStore
from tests.agents import counter


def child(call: str, sequence: int, **payload: Message) -> pb.StreamEvent:
    inner = pb.StreamEvent(
        session_id=f"root-remote-{call}-{child_scope('orchestrator', '')}",
        agent_type="researcher",
        sequence=sequence,
    )
    for kind, message in payload.items():  # the payload field named by its keyword
        getattr(inner, kind).CopyFrom(message)
    return pb.StreamEvent(
        session_id="root",
        agent_type="orchestrator",
        child_event=pb.ChildEvent(tool_call_id=call, event=inner),
    )


def text(call: str, sequence: int, words: str) -> pb.StreamEvent:
    return child(call, sequence, text_delta=pb.TextDelta(text=words))


def tool(call: str, sequence: int, name: str) -> pb.StreamEvent:
    return child(call, sequence, tool_start=pb.ToolStart(tool_name=name, arguments_json="{}"))


def test_concurrent_children_never_share_a_line() -> None:
    out = io.StringIO()
    printer = EventPrinter(out, color=False)
    for event in [
        text("call_1_0", 3, "Writing up "),
        text("call_1_1", 3, "Looking at "),  # the line is call_1_0's: buffered
        tool("call_1_1", 4, "fetch_note"),  # call_1_1's event: its line first, whole
        text("call_1_0", 4, "2 findings."),
        text("call_1_0", 5, "\nDone"),
        tool("call_1_1", 5, "search"),  # breaks call_1_0's open line
        text("call_1_0", 6, " here."),
        child("call_1_0", 7, completed=pb.Completed()),
        text("call_1_1", 6, "Reading "),
        tool("call_1_0", 8, "late"),  # breaks call_1_1's line, which then says no more
        tool("call_1_1", 7, "fetch_note"),
    ]:
        printer.print(event)
    printer.close()

    assert out.getvalue().splitlines() == [
        "  [researcher call_1_0] Writing up …",
        "  [researcher call_1_1] Looking at ",
        "  [researcher call_1_1 #4] → fetch_note({})",
        "  [researcher call_1_1 #5] → search({})",
        "  [researcher call_1_0] …2 findings. Done here.",
        "  [researcher call_1_0 #7] completed",
        "  [researcher call_1_1] Reading …",
        "  [researcher call_1_0 #8] → late({})",
        "  [researcher call_1_1 #7] → fetch_note({})",
    ]


@pytest.mark.parametrize(
    "kind", [f.name for f in pb.StreamEvent.DESCRIPTOR.oneofs_by_name["payload"].fields]
)
def test_every_kind_of_event_is_shown_in_words(kind: str) -> None:
    # A kind the printer did not know showed as "(turn_started)" in `helix-mesh call`.
    if kind == "child_event":
        event = child("call_1_0", 1, completed=pb.Completed())
    else:
        event = pb.StreamEvent(session_id="s", agent_type="a", sequence=1)
        getattr(event, kind).SetInParent()  # this kind, with an empty payload
    out = io.StringIO()
    printer = EventPrinter(out, color=False)
    printer.print(event)
    printer.close()
    assert out.getvalue() and f"({kind})" not in out.getvalue()


def test_a_turn_shows_its_number_and_message() -> None:
    out = io.StringIO()
    printer = EventPrinter(out, color=False)
    turn = pb.TurnStarted(turn=2, message="and now in French", fresh=True)
    printer.print(pb.StreamEvent(session_id="s", agent_type="a", sequence=9, turn_started=turn))
    assert out.getvalue() == "[a #9] turn 2 (fresh) message=and now in French\n"


async def test_serving_on_a_port_in_use_is_a_usage_error_that_says_so() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(UsageError, match="port is in use"):
            await create_server(
                counter,
                MemoryStore(),
                ServerConfig(port=taken.getsockname()[1]),
                allow_unauthenticated=True,
            )
    finally:
        taken.close()
