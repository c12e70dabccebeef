"""A delegation tree as text: one line per session, drawn with box characters.

    orchestrator  completed  4.2 s  3 steps  120 tokens, 560 with children  root-1
    ├─ researcher call_1_0  completed  1.1 s  2 steps  200 tokens  root-1-remote-…
    └─ summarizer call_2_0  running  0.4 s  1 step  0 tokens  root-1-remote-…

A session waiting for input is ``suspended``, with each of its pending requests on a
line of its own under it (``? approval send_email({...})  call_1_0``).

Each line is built as segments (text, colour) so it can be cut to a terminal's
width without cutting through a colour code.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from helix_transport._events import SessionStatus
from helix_transport.cli.printer import child_label
from helix_transport.cli.views import format_duration, format_steps
from helix_transport.tree import PendingRequest, SessionTree, TreeNode

_STATUS_COLORS = {
    SessionStatus.COMPLETED: "32",
    SessionStatus.FAILED: "31",
    SessionStatus.INTERRUPTED: "33",
    SessionStatus.TERMINATED: "33",
    SessionStatus.RUNNING: "36",
    SessionStatus.SUSPENDED: "35",
}
_ERROR_CHARS = 80


class Segment(NamedTuple):
    """Part of a line: its text and its ANSI colour (``None``: plain)."""

    text: str
    color: str | None = None


def tree_lines(tree: SessionTree, *, now: datetime) -> list[list[Segment]]:
    """The lines of ``tree`` (none before its first event); running durations to ``now``."""
    if tree.root is None:
        return []
    lines: list[list[Segment]] = []
    _node_lines(tree.root, lines, prefix="", branch="", now=now)
    return lines


def _node_lines(
    node: TreeNode, lines: list[list[Segment]], *, prefix: str, branch: str, now: datetime
) -> None:
    lines.append([Segment(prefix + branch), *node_segments(node, now=now)])
    inner = prefix + ("" if not branch else "│  " if branch == "├─ " else "   ")
    for request in node.pending.values():
        lines.append(
            [Segment(inner + ("│  " if node.children else "   ")), *request_segments(request)]
        )
    for index, child in enumerate(node.children):
        last = index == len(node.children) - 1
        _node_lines(child, lines, prefix=inner, branch="└─ " if last else "├─ ", now=now)


def node_segments(node: TreeNode, *, now: datetime) -> list[Segment]:
    """One node's line, without its branch: name, status, duration, steps, usage, id."""
    running = not node.status.is_terminal  # running, or suspended: not over
    took = format_duration(node.duration(now=now))
    steps = format_steps(node.step_count)
    usage = f"{node.usage.total_tokens:,} tokens"
    if node.total_usage.total_tokens != node.usage.total_tokens or node.children:
        usage += f", {node.total_usage.total_tokens:,} with children"
    segments = [
        Segment(_label(node), "1"),
        Segment("  "),
        Segment(_status_text(node), _STATUS_COLORS.get(node.status)),
        Segment(f"  {took}{'…' if running and took != '-' else ''}  {steps}  {usage}  "),
        Segment(node.session_id, "2"),
    ]
    if node.error and not running:
        error = node.error.replace("\n", " ")
        if len(error) > _ERROR_CHARS:
            error = error[: _ERROR_CHARS - 1] + "…"
        segments.append(Segment(f"  {error}", "31"))
    return segments


def _status_text(node: TreeNode) -> str:
    limit = node.limit_exceeded
    return f"{node.status.value} ({limit})" if limit else node.status.value


def request_segments(request: PendingRequest) -> list[Segment]:
    """A pending request's line: what it asks for, the call, the id to answer with."""
    kind = "approval" if request.kind == "approval" else "client result"
    arguments = request.arguments_json.replace("\n", " ")
    if len(arguments) > _ERROR_CHARS:
        arguments = arguments[: _ERROR_CHARS - 1] + "…"
    return [
        Segment(f"? {kind} ", _STATUS_COLORS[SessionStatus.SUSPENDED]),
        Segment(f"{request.tool_name}({arguments})  "),
        Segment(request.request_id, "2"),
    ]


def _label(node: TreeNode) -> str:
    return child_label(node.agent_type or "?", node.session_id, node.parent_session_id)


def render(line: list[Segment], *, color: bool, width: int | None = None) -> str:
    """``line`` as text: coloured when ``color``, cut to ``width`` characters (the
    cut marked ``…``) when given."""
    out: list[str] = []
    room = width
    for text, code in line:
        if room is not None:
            if room <= 0:
                break
            if len(text) > room:
                text = text[: max(room - 1, 0)] + "…"
            room -= len(text)
        out.append(f"\x1b[{code}m{text}\x1b[0m" if color and code else text)
    return "".join(out)


def tree_shape(
    tree: SessionTree,
) -> tuple[tuple[str, str, int, int, int, tuple[str, ...]], ...]:
    """What a reader of appended trees wants a new copy for: a node added, a status,
    a step, a usage or its pending requests changed; not every streamed word."""
    if tree.root is None:
        return ()
    return tuple(
        (
            n.session_id,
            n.status.value,
            n.step_count,
            n.usage.total_tokens,
            n.total_usage.total_tokens,
            tuple(n.pending),
        )
        for n in tree.root.walk()
    )
