"""``helix-mesh gc STORE_URL``: remove the expired finished sessions of a store now, and
the ``--retention`` duration that ``serve`` and ``gc`` share."""

from __future__ import annotations

import argparse
import math
import os
import re
from datetime import timedelta

from helix_transport._exceptions import UsageError

RETENTION_ENV = "HELIX_RETENTION"
"""The environment variable ``--retention`` defaults to (unset or ``off``: keep forever)."""

_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>[smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SCHEMES = ("memory://", "sqlite:", "redis://", "rediss://", "postgres://", "postgresql://")


def duration(text: str) -> timedelta:
    """A retention: a positive number with an optional unit, ``90s``, ``30m``, ``12h``,
    ``7d`` or ``2w`` (no unit: seconds)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 90s, 12h or 7d")
    seconds = float(match["number"]) * _UNIT_S[match["unit"]]
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration above 0")
    return timedelta(seconds=seconds)


def retention_from_env() -> timedelta | None:
    """``HELIX_RETENTION`` as a duration; ``None`` when unset, empty or ``off``.

    Raises:
        UsageError: it is set to something that is not a duration.
    """
    text = os.environ.get(RETENTION_ENV, "").strip()
    if text.lower() in ("", "0", "off"):
        return None
    try:
        return duration(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{RETENTION_ENV}: {exc}") from None


def retention_option(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--retention DURATION`` (default ``$HELIX_RETENTION``)."""
    parser.add_argument(
        "--retention",
        type=duration,
        default=None,
        metavar="DURATION",
        help=f"{what} (90s, 12h, 7d...; default ${RETENTION_ENV})",
    )


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gc`` to the subcommands ``sub``."""
    gc = sub.add_parser(
        "gc", help="remove the sessions of a store finished longer ago than the retention"
    )
    gc.add_argument(
        "target",
        metavar="STORE_URL",
        help="the store, as serve's --store (sqlite:///..., redis://..., postgresql://...)",
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    retention_option(gc, what="remove sessions finished longer ago than this")


async def gc(args: argparse.Namespace) -> int:
    """Sweep ``args.target`` once, printing each session removed (or that would be)."""
    from helix_transport.store import open_store, sweep

    retention = args.retention or retention_from_env()
    if retention is None:
        raise UsageError(f"gc needs a retention: give --retention or set {RETENTION_ENV}")
    if not args.target.startswith(_SCHEMES):
        raise UsageError(
            f"{args.target!r} is not a store URL (sqlite:///path.db, redis://host:6379/0, "
            "postgresql://user@host/db); gc works on a store, not on a service's address"
        )
    store = await open_store(args.target)
    try:
        report = await sweep(store, retention=retention, dry_run=args.dry_run)
    finally:
        await store.aclose()
    verb = "would remove" if args.dry_run else "removed"
    for session_id in report.expired:
        print(f"{verb} {session_id}")
    print(f"{verb} {len(report.expired)} session(s) finished more than {retention} ago")
    return 0
