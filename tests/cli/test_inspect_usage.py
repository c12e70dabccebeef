"""The inspect page's live usage (``helix_transport.cli.inspector.usage``): what a
running session's record says is laid over the fold's numbers, while what a terminal
event reported stays the last word."""

from __future__ import annotations

from typing import Any

from helix_transport.cli.inspector.usage import with_live_usage
from helix_transport.tree import TreeUsage


def _usage(own: int, total: int) -> dict[str, Any]:
    return {
        "own": TreeUsage(prompt_tokens=own, total_tokens=own).to_json(),
        "total": TreeUsage(prompt_tokens=total, total_tokens=total).to_json(),
    }


def _node(session_id: str, status: str, own: int, total: int, *children: Any) -> Any:
    return {
        "session_id": session_id,
        "status": status,
        "usage": _usage(own, total),
        "children": list(children),
    }


def test_a_running_tree_shows_its_records_usage_and_its_ended_childrens() -> None:
    ended = _node("done", "completed", 30, 45)  # its terminal event: 30 own, 45 subtree
    running = _node("child", "running", 0, 0)
    suspended = _node("root", "suspended", 0, 45, ended, running)
    live = {
        "root": TreeUsage(prompt_tokens=12, total_tokens=12),
        "child": TreeUsage(prompt_tokens=7, total_tokens=7),
        "done": TreeUsage(prompt_tokens=99, total_tokens=99),  # older than its end's word
    }

    total = with_live_usage(suspended, live)

    assert total.total_tokens == 12 + 7 + 45
    assert suspended["usage"]["own"]["total_tokens"] == 12
    assert suspended["usage"]["total"]["total_tokens"] == 64
    assert running["usage"]["total"]["total_tokens"] == 7
    assert ended["usage"] == _usage(30, 45)


def test_a_record_behind_the_events_changes_nothing() -> None:
    root = _node("root", "running", 20, 20)
    with_live_usage(root, {"root": TreeUsage(total_tokens=5)})
    assert root["usage"] == _usage(20, 20)
    finished = _node("root", "completed", 20, 20)
    with_live_usage(finished, {"root": TreeUsage(total_tokens=50)})
    assert finished["usage"] == _usage(20, 20)
