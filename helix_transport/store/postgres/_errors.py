"""The PostgreSQL store's one boundary for driver errors, and what it checks before connecting."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]

from helix_transport._exceptions import (
    StoreError,
    StoreUnavailable,
    UsageError,
)

# A plain lowercase identifier, short enough that "<schema>_events" is a valid
# NOTIFY channel (63 bytes at most).
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,55}")

# Failures of the connection or the server's availability; retrying later may help.
_UNAVAILABLE = (
    OSError,  # also TimeoutError
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)


def check_schema(schema: str) -> None:
    if not _SCHEMA_NAME.fullmatch(schema):
        raise UsageError(
            f"schema {schema!r}: use a lowercase identifier of at most 56 characters "
            "(letters, digits, underscores)"
        )


def describe_dsn(dsn: str) -> str:
    """``host:port/database`` of ``dsn`` for error messages (never the password)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    where = parts.netloc.rpartition("@")[2] or os.environ.get("PGHOST", "localhost")
    if ":" not in where.rpartition("]")[2] and "," not in where:  # no port, not multi-host
        where += ":" + os.environ.get("PGPORT", "5432")
    return where + parts.path


def _detail(exc: BaseException) -> str:
    return "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__


@contextlib.contextmanager
def map_pg_errors(where: str, *, connecting: bool = False) -> Iterator[None]:
    """Translate ``asyncpg`` and socket exceptions into the helix error tree.

    While ``connecting``, every driver failure (refused, timed out, unknown
    database, rejected login) means the store at ``where`` cannot be reached.
    """
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"PostgreSQL at {where} is unavailable: {_detail(exc)}") from exc
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if connecting and isinstance(exc, asyncpg.ClientConfigurationError):
            raise UsageError(f"invalid PostgreSQL DSN for {where}: {exc}") from exc
        if connecting:
            raise StoreUnavailable(f"cannot connect to PostgreSQL at {where}: {exc}") from exc
        raise StoreError(f"postgres: {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        # While connecting, a ValueError is a bad DSN (asyncpg parses it with urlsplit,
        # int()...) or bad pool sizes.
        if not connecting:
            raise
        raise UsageError(f"invalid PostgreSQL DSN or pool settings for {where}: {exc}") from exc


def is_lost(conn: Any) -> bool:
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # already detached from the pool's proxy
        return True
