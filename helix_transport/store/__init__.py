"""The state store: the ``Store`` contract (its role protocols composed), its records,
its backends and ``open_store``."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from helix_transport._exceptions import UsageError
from helix_transport.config import Environment
from helix_transport.store._base import (
    READ_LIMIT,
    CheckpointStore,
    ChildRefStore,
    EncodedEventReader,
    EventLogStore,
    EventNotifier,
    InputStore,
    InterruptLookup,
    InterruptStore,
    LeaseStore,
    OutboxStore,
    SessionIndex,
    SessionStore,
    Store,
    pages,
)
from helix_transport.store._listing import LIST_LIMIT, SessionPage, SessionQuery
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    input_fingerprint,
    storable_text,
)
from helix_transport.store._retention import Candidate, RetentionStore, Tombstone
from helix_transport.store._sweep import SweepReport, sweep
from helix_transport.store.memory import MemoryStore
from helix_transport.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from helix_transport.store.postgres import PostgresStore
    from helix_transport.store.redis import RedisStore

__all__ = [
    "LIST_LIMIT",
    "READ_LIMIT",
    "STORE_URL_ENV",
    "Candidate",
    "Checkpoint",
    "CheckpointStore",
    "ChildCommand",
    "ChildRefStore",
    "EncodedEventReader",
    "EventLogStore",
    "EventNotifier",
    "InputStore",
    "Interrupt",
    "InterruptLookup",
    "InterruptStore",
    "LeaseStore",
    "MemoryStore",
    "OutboxStore",
    "PostgresStore",
    "RedisStore",
    "RetentionStore",
    "SessionIndex",
    "SessionPage",
    "SessionQuery",
    "SessionRecord",
    "SessionStore",
    "SessionUpdate",
    "SqliteStore",
    "Store",
    "SubSessionRef",
    "SweepReport",
    "Tombstone",
    "Usage",
    "input_fingerprint",
    "open_store",
    "pages",
    "storable_text",
    "store_url_from_env",
    "sweep",
]


def __getattr__(name: str) -> Any:
    # The Redis and PostgreSQL clients load on first use (about 6 MiB a process that
    # uses neither), through open_store or these names.
    if name == "PostgresStore":
        from helix_transport.store.postgres import PostgresStore

        return PostgresStore
    if name == "RedisStore":
        from helix_transport.store.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STORE_URL_ENV = "HELIX_STORE_URL"
"""The environment variable that names the store URL."""

_SQLITE_PREFIX = "sqlite:///"


async def open_store(url: str, *, allow_volatile: bool | None = None) -> Store:
    """Open the store ``url`` names; the caller owns it and must ``aclose()`` it.

    A Redis that keeps nothing on disk (``appendonly no`` and no ``save`` rules) is
    refused: its restart would lose every session. ``allow_volatile=True`` accepts it
    (throwaway data); ``None`` leaves it to ``HELIX_ALLOW_VOLATILE_STORE=1``.

    Supported URLs:

    - ``memory://``: a fresh ``MemoryStore`` (nothing survives the process).
    - ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``: a
      ``SqliteStore``. As in SQLAlchemy, the path is everything after the third
      slash, so a fourth slash makes it absolute. ``sqlite:///:memory:`` is an
      in-memory SQLite database.

    - ``redis://host:6379/0`` (``rediss://`` for TLS): a ``RedisStore``; the
      optional ``?prefix=`` query parameter namespaces its keys (default ``helix``).
    - ``postgresql://user:password@host:5432/db``: a ``PostgresStore``; the optional
      ``?schema=`` query parameter picks its schema (default ``helix``). Migrations run
      on open.

    Raises:
        UsageError: the URL is malformed or names an unsupported backend, or a
            Redis without persistence was not allowed.
        StoreUnavailable: the backend cannot be reached or opened (so a wrong URL
            fails at start, not at the first request).
    """
    if url == "memory://":
        return MemoryStore()
    if url.startswith(_SQLITE_PREFIX):
        path = url.removeprefix(_SQLITE_PREFIX)
        if not path:
            raise UsageError(f"store URL {url!r} has no path: use sqlite:///path/to/file.db")
        return await SqliteStore.open(path)
    if url.startswith("sqlite:"):
        # sqlite://host/... has no meaning and sqlite:/x is a typo; say what works.
        raise UsageError(
            f"store URL {url!r} is malformed: use sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme in ("redis", "rediss"):
        from helix_transport.store.redis import RedisStore

        base, prefix = _pop_query(url, "prefix")
        return await RedisStore.from_url(
            base, prefix=prefix or "helix", allow_volatile=allow_volatile
        )
    if scheme in ("postgres", "postgresql"):
        from helix_transport.store.postgres import PostgresStore

        base, schema = _pop_query(url, "schema")
        return await PostgresStore.open(base, schema=schema or "helix")
    raise UsageError(
        f"unsupported store URL {url!r}: use memory://, sqlite:///path/to/file.db, "
        "redis://host:6379/0[?prefix=helix] or postgresql://user@host:5432/db[?schema=helix]"
    )


def _pop_query(url: str, key: str) -> tuple[str, str]:
    """``url`` without the query parameter ``key``, and that parameter's value."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    value = next((v for k, v in query if k == key), "")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != key])
    return urllib.parse.urlunsplit(parts._replace(query=rest)), value


def store_url_from_env(default: str) -> str:
    """The store URL from ``HELIX_STORE_URL``, or ``default`` when unset or empty."""
    return Environment().store_url(default)
