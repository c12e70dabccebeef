"""The fold's requests for input: pending from ``input_required`` until ``input_answered``
or the asking session's end, listed for the whole tree; ``SUSPENDED`` from a
``suspended`` event to the session's next event.

Hand-written logs of the shape issue 41's contract gives: root -> orchestrator (remote,
call r1) -> mailer (remote, call m1), the mailer asking for an approval; each level's
events wrapped once more in its parent's log.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from helix_transport import SessionStatus, SessionTree
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.treeview import render, tree_lines, tree_shape
from helix_transport.tree import PendingRequest


class Log:
    """Builds the root's log: each event given for a session is wrapped up to the root."""

    def __init__(self) -> None:
        self.parents = {"mid": ("root", "r1"), "leaf": ("mid", "m1")}
        self.sequences: dict[str, int] = {}
        self.events: list[pb.StreamEvent] = []

    def add(self, session: str, **payload: object) -> pb.StreamEvent:
        event = self._event(session, **payload)
        while session in self.parents:
            session, call = self.parents[session]
            event = self._event(session, child_event=pb.ChildEvent(tool_call_id=call, event=event))
        self.events.append(event)
        return event

    def _event(self, session: str, **payload: object) -> pb.StreamEvent:
        sequence = self.sequences[session] = self.sequences.get(session, 0) + 1
        event = pb.StreamEvent(session_id=session, sequence=sequence, agent_type=session, **payload)  # type: ignore[arg-type]
        event.time.seconds = 1_700_000_000 + len(self.events)
        return event


def _asked(request_id: str, path: list[str], **fields: object) -> pb.InputRequired:
    return pb.InputRequired(
        request_id=request_id,
        tool_name="send_email",
        arguments_json=json.dumps({"to": "ana@example.com"}),
        kind=pb.INPUT_KIND_APPROVAL,
        path=path,
        **fields,  # type: ignore[arg-type]
    )


def _suspended_tree() -> tuple[Log, SessionTree]:
    log = Log()
    log.add("root", run_started=pb.RunStarted())
    log.add("root", subagent_start=pb.SubagentStart(tool_call_id="r1", child_session_id="mid", child_agent_type="mid"))  # fmt: skip
    log.add("mid", run_started=pb.RunStarted(parent_session_id="root"))
    log.add("mid", subagent_start=pb.SubagentStart(tool_call_id="m1", child_session_id="leaf", child_agent_type="leaf"))  # fmt: skip
    log.add("leaf", run_started=pb.RunStarted(parent_session_id="mid"))
    log.add("leaf", input_required=_asked("call_1_0", ["root", "mid", "leaf"]))
    log.add("leaf", suspended=pb.Suspended(request_ids=["call_1_0"]))
    log.add("mid", suspended=pb.Suspended(suspended_children=1))
    log.add("root", suspended=pb.Suspended(suspended_children=1))
    tree = SessionTree()
    for event in log.events:
        tree.add(event)
    return log, tree


def test_a_request_deep_in_the_tree_is_pending_at_the_root_and_every_level_is_suspended() -> None:
    _, tree = _suspended_tree()
    assert tree.pending_requests() == [
        PendingRequest(
            session_id="leaf",
            request_id="call_1_0",
            tool_name="send_email",
            arguments_json='{"to": "ana@example.com"}',
            kind="approval",
            path=("root", "mid", "leaf"),
        )
    ]
    assert tree.root is not None
    assert [n.status for n in tree.root.walk()] == [SessionStatus.SUSPENDED] * 3


def test_the_answer_takes_the_request_away_and_each_level_runs_again_with_its_next_event() -> None:
    log, tree = _suspended_tree()
    tree.add(log.add("leaf", run_resumed=pb.RunResumed(reason="input")))
    # The leaf's event reached the root's log: every level on the way is running.
    assert {n.status for n in tree.root.walk()} == {SessionStatus.RUNNING}  # type: ignore[union-attr]
    assert len(tree.pending_requests()) == 1  # still, until the answer is logged
    answered = pb.InputAnswered(request_id="call_1_0", outcome=pb.INPUT_OUTCOME_APPROVED)
    tree.add(log.add("leaf", input_answered=answered))
    assert tree.pending_requests() == []


def test_a_request_leaves_with_its_session_s_end_and_a_replay_changes_nothing() -> None:
    log, tree = _suspended_tree()
    for event in log.events:  # a reconnect's overlap
        tree.add(event)
    assert len(tree.pending_requests()) == 1
    assert tree.node("root").status is SessionStatus.SUSPENDED  # type: ignore[union-attr]
    tree.add(log.add("leaf", terminated=pb.Terminated(reason="aborted")))
    assert tree.pending_requests() == []
    assert tree.node("leaf").status is SessionStatus.TERMINATED  # type: ignore[union-attr]


def test_an_aborted_root_stops_its_suspended_subtree_and_its_requests() -> None:
    """The root's abort ends it at once; the children end through their own services, and
    the root, ended, forwards no more of their events."""
    log, tree = _suspended_tree()
    tree.add(log.add("root", run_resumed=pb.RunResumed(reason="interrupt")))
    tree.add(log.add("root", terminated=pb.Terminated(reason="aborted")))
    assert tree.pending_requests() == []
    assert tree.root is not None
    assert {n.status for n in tree.root.walk()} == {SessionStatus.TERMINATED}


def test_a_parent_s_word_that_a_child_ended_takes_its_requests_away() -> None:
    log, tree = _suspended_tree()
    ended = pb.SubagentEnd(
        tool_call_id="m1",
        child_session_id="leaf",
        child_agent_type="leaf",
        status=pb.SESSION_STATUS_INTERRUPTED,
    )
    tree.add(log.add("mid", subagent_end=ended))
    assert tree.pending_requests() == []


def test_the_path_comes_from_the_tree_when_the_event_has_none_and_a_deadline_is_kept() -> None:
    log = Log()
    log.add("root", run_started=pb.RunStarted())
    log.add("root", subagent_start=pb.SubagentStart(tool_call_id="r1", child_session_id="mid", child_agent_type="mid"))  # fmt: skip
    asked = _asked("c9", [])
    asked.kind = pb.INPUT_KIND_CLIENT_RESULT
    asked.deadline.FromDatetime(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))
    log.add("mid", input_required=asked)
    tree = SessionTree()
    for event in log.events:
        tree.add(event)
    (request,) = tree.pending_requests()
    assert request.path == ("root", "mid") and request.kind == "client_result"
    assert request.deadline == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert request.to_json()["deadline"] == "2030-01-02T03:04:05.000000Z"
    assert request.to_json()["arguments"] == {"to": "ana@example.com"}
    node = tree.node("mid")
    assert node is not None and node.to_json()["pending_requests"] == [request.to_json()]


def test_the_tree_view_shows_suspended_and_the_request_under_its_node() -> None:
    log, tree = _suspended_tree()
    now = datetime.fromtimestamp(1_700_000_100, tz=UTC)
    text = [render(line, color=False) for line in tree_lines(tree, now=now)]
    assert text[0].startswith("root  suspended")
    leaf = next(i for i, line in enumerate(text) if "leaf  suspended" in line)
    assert "? approval send_email" in text[leaf + 1] and "call_1_0" in text[leaf + 1]
    assert '{"to": "ana@example.com"}' in text[leaf + 1]
    before = tree_shape(tree)
    answered = pb.InputAnswered(request_id="call_1_0", outcome=pb.INPUT_OUTCOME_DENIED)
    tree.add(log.add("leaf", input_answered=answered))
    assert tree_shape(tree) != before  # a request that leaves is a change to redraw
    assert not any("? approval" in render(line, color=False) for line in tree_lines(tree, now=now))
