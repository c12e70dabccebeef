"""The fold (``helix_transport.tree``): a root's log, children nested, into a tree.

Built from hand-written logs: the shapes a parent's log takes (remote, companion and
task children, nesting, replays, a continued child, a child not forwarded).
"""

from __future__ import annotations

import json

import pytest

from helix_transport import SessionStatus, SessionTree, TreeUsage, fold_events
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


def _ev(
    session: str, sequence: int, agent: str = "a", seconds: int = 0, **payload: object
) -> pb.StreamEvent:
    event = pb.StreamEvent(session_id=session, sequence=sequence, agent_type=agent, **payload)  # type: ignore[arg-type]
    event.time.seconds = 1_700_000_000 + (seconds or sequence)
    return event


def _usage(p: int, c: int) -> pb.TokenUsage:
    return pb.TokenUsage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _wrap(
    call: str, event: pb.StreamEvent, session: str, sequence: int, agent: str = "a"
) -> pb.StreamEvent:
    return _ev(session, sequence, agent, child_event=pb.ChildEvent(tool_call_id=call, event=event))


def _log() -> list[pb.StreamEvent]:
    """root -> child (remote, call c1) -> grandchild (task, call g1)."""
    gc = [
        _ev("gc", 1, "leaf", run_started=pb.RunStarted(parent_session_id="child")),
        _ev("gc", 2, "leaf", step=1, step_started=pb.StepStarted()),
        _ev(
            "gc",
            3,
            "leaf",
            step=1,  # the run loop stamps each event with its step
            completed=pb.Completed(
                output_json='{"x": 1}', usage=_usage(3, 4), total_usage=_usage(3, 4)
            ),
        ),
    ]
    child = [
        _ev("child", 1, "mid", run_started=pb.RunStarted(parent_session_id="root")),
        _ev(
            "child",
            2,
            "mid",
            subagent_start=pb.SubagentStart(
                tool_call_id="g1", child_session_id="gc", child_agent_type="leaf"
            ),
        ),
        *[_wrap("g1", e, "child", 3 + i, "mid") for i, e in enumerate(gc)],
        _ev(
            "child",
            6,
            "mid",
            subagent_end=pb.SubagentEnd(
                tool_call_id="g1",
                child_session_id="gc",
                status=pb.SESSION_STATUS_COMPLETED,
                output_json='{"x": 1}',
            ),
        ),
        _ev(
            "child",
            7,
            "mid",
            completed=pb.Completed(
                output_json="{}", usage=_usage(10, 1), total_usage=_usage(13, 5)
            ),
        ),
    ]
    return [
        _ev("root", 1, "top", run_started=pb.RunStarted()),
        _ev(
            "root",
            2,
            "top",
            subagent_start=pb.SubagentStart(
                tool_call_id="c1",
                child_session_id="child",
                child_agent_type="mid",
                address="127.0.0.1:1",
            ),
        ),
        *[_wrap("c1", e, "root", 3 + i, "top") for i, e in enumerate(child)],
        _ev(
            "root",
            10,
            "top",
            subagent_end=pb.SubagentEnd(
                tool_call_id="c1",
                child_session_id="child",
                status=pb.SESSION_STATUS_COMPLETED,
                output_json="{}",
            ),
        ),
        _ev(
            "root",
            11,
            "top",
            completed=pb.Completed(
                output_json='{"ok": true}', usage=_usage(100, 20), total_usage=_usage(113, 25)
            ),
        ),
    ]


def test_a_log_folds_into_its_tree_with_every_depth_nested() -> None:
    tree = fold_events(_log())
    root = tree.root
    assert root is not None and root.status is SessionStatus.COMPLETED
    (child,) = root.children
    (grandchild,) = child.children
    assert (child.session_id, child.tool_call_id, child.address) == ("child", "c1", "127.0.0.1:1")
    assert (grandchild.agent_type, grandchild.parent_session_id, grandchild.step_count) == (
        "leaf",
        "child",
        1,
    )
    assert grandchild.output_json == '{"x": 1}' and len(grandchild.events) == 3
    assert child.usage == TreeUsage(prompt_tokens=10, completion_tokens=1, total_tokens=11)
    assert root.total_usage == TreeUsage(prompt_tokens=113, completion_tokens=25, total_tokens=138)
    # The parent's own events are its own: no ChildEvent wrappers in them.
    assert [e.WhichOneof("payload") for e in root.events] == [
        "run_started",
        "subagent_start",
        "subagent_end",
        "completed",
    ]
    assert tree.node("gc") is grandchild
    duration = grandchild.duration()
    assert duration is not None and duration.total_seconds() == 2
    shown = root.to_json()
    assert shown["status"] == "completed" and shown["output"] == {"ok": True}
    assert shown["usage"] == {
        "own": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        "total": {"prompt_tokens": 113, "completion_tokens": 25, "total_tokens": 138},
    }
    assert shown["started_at"] == "2023-11-14T22:13:21.000000Z"  # one precision
    json.dumps(shown)


def test_a_replayed_event_changes_nothing_at_any_depth() -> None:
    log = _log()
    once = fold_events(log)
    tree = SessionTree()
    for event in [*log[:6], *log[3:], *log]:
        tree.add(event)
    assert tree.root is not None and once.root is not None
    assert tree.root.to_json() == once.root.to_json()
    assert [len(n.events) for n in tree.root.walk()] == [len(n.events) for n in once.root.walk()]


def test_a_running_tree_totals_what_its_ended_children_report() -> None:
    log = _log()[:10]  # the child ended, the root runs on
    root = fold_events(log).root
    assert root is not None and root.status is SessionStatus.RUNNING
    assert root.total_usage.total_tokens == 18
    assert root.duration() is None


def test_add_returns_the_innermost_node_touched() -> None:
    tree = SessionTree()
    touched = [tree.add(e).session_id for e in _log()]
    assert touched == [
        "root",
        "root",
        "child",
        "child",
        "gc",
        "gc",
        "gc",
        "child",
        "child",
        "root",
        "root",
    ]


def test_a_child_known_only_by_its_parents_end_is_ended_by_it() -> None:
    log = [
        _ev("r", 1, run_started=pb.RunStarted()),
        _ev(
            "r",
            2,
            subagent_start=pb.SubagentStart(
                tool_call_id="t", child_session_id="k", child_agent_type="b"
            ),
        ),
        _ev(
            "r",
            3,
            subagent_end=pb.SubagentEnd(
                tool_call_id="t",
                child_session_id="k",
                child_agent_type="b",
                status=pb.SESSION_STATUS_FAILED,
                error="boom",
            ),
        ),
        # A second turn of the same child reopens it.
        _ev(
            "r",
            4,
            subagent_start=pb.SubagentStart(
                tool_call_id="u", child_session_id="k", child_agent_type="b"
            ),
        ),
    ]
    tree = fold_events(log[:3])
    child = tree.node("k")
    assert child is not None and (child.status, child.error) == (SessionStatus.FAILED, "boom")
    tree.add(log[3])
    assert child.status is SessionStatus.RUNNING and child.error is None


def test_an_event_of_another_session_is_refused() -> None:
    tree = fold_events(_log()[:1])
    with pytest.raises(ValueError, match="'other'"):
        tree.add(_ev("other", 1, run_started=pb.RunStarted()))
