"""``helix-mesh gc STORE_URL|ADDRESS``: remove the expired finished sessions of a store
now (directly, or through a service's admin RPC), and the ``--retention`` duration and
``--admin-principal`` that ``serve`` and ``gc`` share."""

from __future__ import annotations

import argparse
import asyncio
import os
import urllib.parse
from datetime import timedelta

from helix_transport._exceptions import UsageError
from helix_transport._optional import requires
from helix_transport.cli.durations import EXAMPLES, positive_duration_arg
from helix_transport.cli.flags import client_auth, client_options
from helix_transport.cli.jsonout import dumps
from helix_transport.config import Environment

ADMINS_ENV = "HELIX_ADMIN_PRINCIPALS"
"""Comma-separated principals (of no tenant) that may call a service's admin RPC."""
RETENTION_ENV = "HELIX_RETENTION"
"""The environment variable ``--retention`` defaults to (unset or ``off``: keep forever)."""

_SCHEMES = ("memory://", "sqlite:", "redis://", "rediss://", "postgres://", "postgresql://")


def duration(text: str) -> timedelta:
    """A retention: a duration above 0 in the one grammar (``durations``): ``90s``,
    ``12h``, ``1h30m``, ``7d``, ``2w`` (no unit: seconds)."""
    return positive_duration_arg(text)


def retention_option(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--retention DURATION`` (default ``$HELIX_RETENTION``)."""
    parser.add_argument(
        "--retention",
        type=duration,
        default=None,
        metavar="DURATION",
        help=f"{what} ({EXAMPLES}...; default ${RETENTION_ENV})",
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
    gc.add_argument("--json", action="store_true", help="print what was removed as JSON")
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
    if args.json:
        shown = {
            "target": args.target,
            "dry_run": args.dry_run,
            "retention": retention.total_seconds(),  # a duration is seconds, as in jsonout
            "expired_session_ids": expired,
        }
        print(dumps(shown))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for session_id in expired:
        print(f"{verb} {session_id}")
    print(f"{verb} {len(expired)} session(s) finished more than {retention} ago")
    return 0


async def _sweep_store(url: str, retention: timedelta, *, dry_run: bool) -> list[str]:
    from helix_transport.store import open_store, sweep

    await require_existing_store(url)
    store = await open_store(url)
    try:
        return (await sweep(store, retention=retention, dry_run=dry_run)).expired
    finally:
        await store.aclose()


async def require_existing_store(url: str) -> None:
    """Refuse a store that is not there: opening a SQLite file or a PostgreSQL schema
    creates it, and a command asked to read or sweep a store must not make one.

    Raises:
        UsageError: the SQLite file, or the PostgreSQL schema, does not exist.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "sqlite":
        path = url.removeprefix("sqlite:///")
        if path != ":memory:" and not await asyncio.to_thread(os.path.exists, path):
            raise UsageError(f"no store at {url}: {path} does not exist (gc creates none)")
    elif parts.scheme in ("postgres", "postgresql"):
        query = urllib.parse.parse_qsl(parts.query)
        schema = next((v for k, v in query if k == "schema"), "") or "helix"
        rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "schema"])
        if not await _postgres_schema_exists(
            urllib.parse.urlunsplit(parts._replace(query=rest)), schema
        ):
            raise UsageError(
                f"no store at {url}: schema {schema!r} does not exist (gc creates none)"
            )


async def _postgres_schema_exists(dsn: str, schema: str) -> bool:
    with requires("postgres", "the PostgreSQL store (postgresql://)"):
        import asyncpg  # type: ignore[import-untyped]

    from helix_transport._exceptions import StoreUnavailable

    try:
        connection = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot reach the PostgreSQL store: {exc}") from exc
    try:
        found = await connection.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", schema
        )
    finally:
        await connection.close()
    return found is not None


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
