"""``helix-mesh gc STORE_URL|ADDRESS``: remove the expired finished sessions of a store
now (directly, or through a service's admin RPC), and the ``--retention`` duration and
``--admin-principal`` that ``serve`` and ``gc`` share."""

from __future__ import annotations

import argparse
from datetime import timedelta

from helix_transport._exceptions import UsageError
from helix_transport.cli.flags import client_auth, client_options
from helix_transport.config import Environment, parse_duration

ADMINS_ENV = "HELIX_ADMIN_PRINCIPALS"
"""Comma-separated principals (of no tenant) that may call a service's admin RPC."""
RETENTION_ENV = "HELIX_RETENTION"
"""The environment variable ``--retention`` defaults to (unset or ``off``: keep forever)."""

_SCHEMES = ("memory://", "sqlite:", "redis://", "rediss://", "postgres://", "postgresql://")


def duration(text: str) -> timedelta:
    """A retention: a positive number with an optional unit, ``90s``, ``30m``, ``12h``,
    ``7d`` or ``2w`` (no unit: seconds)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def retention_option(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--retention DURATION`` (default ``$HELIX_RETENTION``)."""
    parser.add_argument(
        "--retention",
        type=duration,
        default=None,
        metavar="DURATION",
        help=f"{what} (90s, 12h, 7d...; default ${RETENTION_ENV})",
    )


def admin_option(parser: argparse.ArgumentParser) -> None:
    """``--admin-principal NAME`` (repeatable; default ``$HELIX_ADMIN_PRINCIPALS``)."""
    parser.add_argument(
        "--admin-principal",
        action="append",
        default=None,
        metavar="NAME",
        help=f"a principal of no tenant that may run `gc ADDRESS` (repeatable; ${ADMINS_ENV})",
    )


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gc`` to the subcommands ``sub``."""
    gc = sub.add_parser(
        "gc", help="remove the sessions of a store finished longer ago than the retention"
    )
    gc.add_argument(
        "target",
        metavar="STORE_URL|ADDRESS",
        help="a store, as serve's --store (sqlite:///..., redis://..., postgresql://...), "
        "or a service's host:port, whose admin RPC sweeps its store",
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    retention_option(gc, what="remove sessions finished longer ago than this")
    client_options(gc)


async def gc(args: argparse.Namespace) -> int:
    """Sweep ``args.target`` once, printing each session removed (or that would be)."""
    retention = args.retention or Environment().retention()
    if retention is None:
        raise UsageError(f"gc needs a retention: give --retention or set {RETENTION_ENV}")
    if args.target.startswith(_SCHEMES):
        expired = await _sweep_store(args.target, retention, dry_run=args.dry_run)
    elif "://" in args.target.removeprefix("dns:///"):
        raise UsageError(
            f"{args.target!r} is neither a store URL (sqlite:///path.db, redis://host:6379/0, "
            "postgresql://user@host/db) nor a service address (host:port)"
        )
    else:
        expired = await _sweep_service(args, retention)
    verb = "would remove" if args.dry_run else "removed"
    for session_id in expired:
        print(f"{verb} {session_id}")
    print(f"{verb} {len(expired)} session(s) finished more than {retention} ago")
    return 0


async def _sweep_store(url: str, retention: timedelta, *, dry_run: bool) -> list[str]:
    from helix_transport.store import open_store, sweep

    store = await open_store(url)
    try:
        return (await sweep(store, retention=retention, dry_run=dry_run)).expired
    finally:
        await store.aclose()


async def _sweep_service(args: argparse.Namespace, retention: timedelta) -> list[str]:
    """``AdminService.Sweep`` on the service at ``args.target``, with the caller's
    credentials; its errors become ``HelixError``s at the transport's one boundary."""
    from helix_transport._proto.helix.admin.v1 import admin_pb2 as pb
    from helix_transport._proto.helix.admin.v1 import admin_pb2_grpc as pb_grpc
    from helix_transport.transport import map_grpc_errors, open_channel

    request = pb.SweepRequest(dry_run=args.dry_run)
    request.retention.FromTimedelta(retention)
    async with open_channel(args.target, client_auth(args)) as channel:
        with map_grpc_errors(args.target):
            # A sweep of a large store takes a while; a minute bounds a stuck service.
            response = await pb_grpc.AdminServiceStub(channel).Sweep(request, timeout=60)
    return list(response.expired_session_ids)
