"""``helix-mesh sessions ADDRESS``: the caller's recent sessions on a service, newest first.

A table for people (id, agent type, status, created, duration, last sequence), or
with ``--json`` one object per line, with numbers as numbers and times as RFC 3339.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from helix_transport._events import SessionStatus
from helix_transport._exceptions import RemoteError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.durations import EXAMPLES, parse_duration
from helix_transport.cli.flags import client_auth, client_options
from helix_transport.cli.jsonout import message_json
from helix_transport.cli.printer import status_name
from helix_transport.transport import AgentClient

DEFAULT_LIMIT = 50
_COLUMNS = ("SESSION ID", "AGENT TYPE", "STATUS", "CREATED", "DURATION", "LAST SEQ")


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sessions`` to the subcommands ``sub`` (an ``add_subparsers`` result)."""
    parser = sub.add_parser("sessions", help="list your sessions on a service, newest first")
    parser.add_argument("address")
    parser.add_argument(
        "--status",
        action="extend",
        nargs="+",
        default=[],
        choices=[s.value for s in SessionStatus],
        help="only sessions in these statuses (repeatable)",
    )
    parser.add_argument("--agent-type", default="", help="only sessions of this agent type")
    parser.add_argument(
        "--since",
        type=since,
        metavar="DURATION|TIME",
        help=f"only sessions created since: a duration ago ({EXAMPLES}) or a time "
        "(2026-11-26T09:00Z)",
    )
    parser.add_argument("--roots", action="store_true", help="only sessions without a parent")
    parser.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"at most N sessions (default {DEFAULT_LIMIT}; 0 for all)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per session")
    client_options(parser)


def since(text: str, *, now: datetime | None = None) -> datetime:
    """``--since``: a duration ago (``90s``, ``1h30m``, ``7d``) or an ISO 8601 time
    (a time without a zone is local)."""
    now = now or datetime.now(UTC)
    with contextlib.suppress(ValueError, OverflowError):  # else: a time
        return now - parse_duration(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration ({EXAMPLES}) nor a time (2026-11-26T09:00:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (all) or more")
    return value


async def sessions(args: argparse.Namespace) -> int:
    """Print the caller's sessions: 0 when the listing was answered (even empty), 1 when
    the service does not implement ``ListSessions``."""
    try:
        return await _sessions(args)
    except RemoteError as exc:
        if exc.code != "UNIMPLEMENTED":
            raise
        print(
            f"helix-mesh: {args.address} does not implement ListSessions (optional in the "
            "contract)",
            file=sys.stderr,
        )
        return 1


async def _sessions(args: argparse.Namespace) -> int:
    async with await AgentClient.connect(args.address, auth=client_auth(args)) as client:
        listed = client.iter_sessions(
            statuses=[SessionStatus(s) for s in args.status],
            agent_type=args.agent_type,
            created_after=args.since,
            roots_only=args.roots,
            limit=args.limit or None,
        )
        if args.json:
            async for summary in listed:
                print(json.dumps(message_json(summary)), flush=True)
            return 0
        rows = [_row(summary, now=time.time()) async for summary in listed]
    if not rows:
        print("no sessions", file=sys.stderr)
        return 0
    print(table(rows))
    return 0


def _row(summary: pb.SessionSummary, *, now: float) -> tuple[str, ...]:
    created = summary.created_at.ToNanoseconds() / 1e9
    if summary.HasField("finished_at"):
        took = duration(summary.finished_at.ToNanoseconds() / 1e9 - created)
    else:
        took = duration(now - created) + "…"  # still running: so far
    return (
        summary.session_id,
        summary.agent_type,
        status_name(summary.status),
        datetime.fromtimestamp(created).astimezone().strftime("%Y-%m-%d %H:%M:%S"),
        took,
        str(summary.last_sequence),
    )


def duration(seconds: float) -> str:
    """``850ms``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def table(rows: Sequence[tuple[str, ...]]) -> str:
    """``rows`` under ``_COLUMNS``, each column as wide as its widest cell; the last
    column (a number) right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(_COLUMNS, *rows, strict=True)]
    lines = []
    for row in (_COLUMNS, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*cells, row[-1].rjust(widths[-1])]))
    return "\n".join(lines)
