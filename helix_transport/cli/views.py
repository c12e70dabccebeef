"""What ``status`` and ``describe`` print for people, and the small formats the
commands share (durations, token counts, colour)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Protocol

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.printer import status_name
from helix_transport.tree import rfc3339

_STATUS_COLORS = {
    "completed": "32",
    "failed": "31",
    "interrupted": "33",
    "terminated": "33",
    "suspended": "35",
}


_NOT_ENDED = (pb.SESSION_STATUS_RUNNING, pb.SESSION_STATUS_SUSPENDED)


class Usage(Protocol):
    """Token counts: ``pb.TokenUsage`` and ``tree.TreeUsage`` both have them."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...


def paint(code: str, text: str, *, color: bool) -> str:
    """``text`` in the ANSI SGR ``code`` (``"31"`` red) when ``color`` is on."""
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def paint_status(name: str, *, color: bool) -> str:
    """A status name (``completed``) in its colour: green, red, yellow, plain if running."""
    return paint(_STATUS_COLORS[name], name, color=color) if name in _STATUS_COLORS else name


def format_duration(duration: timedelta | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``; ``-`` when unknown."""
    if duration is None:
        return "-"
    seconds = max(duration.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def format_steps(step_count: int) -> str:
    """``1 step completed``, ``0 steps completed``: ``step_count`` as ``status`` and
    ``tree`` both show it (steps completed, as ``GetStatusResponse.step_count``)."""
    return f"{step_count} step{'' if step_count == 1 else 's'} completed"


def format_usage(usage: Usage) -> str:
    """``1,234 tokens (900 prompt + 334 completion)``."""
    return (
        f"{usage.total_tokens:,} tokens "
        f"({usage.prompt_tokens:,} prompt + {usage.completion_tokens:,} completion)"
    )


def _json_block(text: str, indent: str) -> str:
    """Pretty JSON, indented under a label; the text as it is if it is not JSON."""
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = text
    return "\n".join(indent + line for line in pretty.splitlines())


def status_text(status: pb.GetStatusResponse, *, include_children: bool, color: bool) -> str:
    """A session's status as aligned ``label  value`` lines."""
    name = status_name(status.status)
    rows = [
        ("session", status.session_id),
        ("agent", status.agent_type),
        ("status", paint_status(name, color=color)),
    ]
    if status.parent_session_id:
        rows.append(("parent", status.parent_session_id))
    rows.append(("progress", format_steps(status.step_count)))
    rows.append(("last sequence", str(status.last_sequence)))
    if status.HasField("created_at"):
        rows.append(("created", str(rfc3339(status.created_at.ToDatetime(tzinfo=UTC)))))
    if status.HasField("finished_at"):
        took = status.finished_at.ToDatetime() - status.created_at.ToDatetime()
        finished = rfc3339(status.finished_at.ToDatetime(tzinfo=UTC))
        rows.append(("finished", f"{finished} ({format_duration(took)})"))
    elif status.status in _NOT_ENDED and status.HasField("created_at"):
        so_far = datetime.now(UTC) - status.created_at.ToDatetime(tzinfo=UTC)
        rows.append(("running for", format_duration(so_far)))
    if status.status == pb.SESSION_STATUS_SUSPENDED:
        rows.append(("waiting for", "input: `helix-mesh tree` lists it, `respond` answers"))
    rows.append(("usage", format_usage(status.usage)))
    if status.limit_exceeded:
        rows.append(("limit", f"{status.limit_exceeded}: ended by its limits"))
    if include_children:
        rows.append(("usage with children", format_usage(status.total_usage)))
    if status.error:
        reason = f" ({status.failure_reason})" if status.failure_reason else ""
        rows.append(("error", paint("31", status.error + reason, color=color)))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if status.output_json:
        lines += ["output", _json_block(status.output_json, "  ")]
    return "\n".join(lines)


def describe_text(described: pb.DescribeResponse) -> str:
    """An agent's type, description, tools and schemas."""
    lines = [
        f"agent  {described.agent_type}",
        f"tools  {', '.join(described.tool_names) or '-'}",
    ]
    if described.description:
        lines += ["", described.description]
    for label, schema in (
        ("input schema", described.input_schema_json),
        ("output schema", described.output_schema_json),
    ):
        if schema:
            lines += ["", label, _json_block(schema, "  ")]
    return "\n".join(lines)
