"""Connection helpers of the SQLite store: error mapping and write transactions."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from helix_transport._exceptions import (
    StoreError,
    StoreUnavailable,
)

_A = TypeVar("_A")

# Errors of the environment (locked past busy_timeout, unopenable file, full or
# failing disk) that may clear up on their own; anything else is a bug or corruption.
_TRANSIENT_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_PROTOCOL,
    }
)


@contextmanager
def map_sqlite_errors() -> Iterator[None]:
    """Translate ``sqlite3`` exceptions into the helix error tree."""
    try:
        yield
    except UNBINDABLE as exc:
        raise store_error(exc) from exc


UNBINDABLE = (sqlite3.Error, OverflowError, UnicodeEncodeError)
"""What sqlite3 raises for a value it cannot bind (an integer past 64 bits, a lone
surrogate) besides its own errors."""


def store_error(exc: Exception) -> StoreError:
    if not isinstance(exc, sqlite3.Error):
        return StoreError(f"sqlite: cannot store a value: {exc}")
    # Extended result codes carry the primary code in their low byte.
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in _TRANSIENT_CODES:
        return StoreUnavailable(f"sqlite: {exc}")
    return StoreError(f"sqlite: {exc}")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: commit on success, roll back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT can leave the transaction open; never leak it to the next call.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def write(conn: sqlite3.Connection, sql: str, params: Any) -> None:
    with transaction(conn):
        conn.execute(sql, params)


def in_transaction(
    conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection, _A], None], arg: _A
) -> None:
    with transaction(conn):
        fn(conn, arg)
