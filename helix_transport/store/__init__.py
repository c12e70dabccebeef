"""The state store: the ``Store`` contract, its records, its backends and ``open_store``."""

from __future__ import annotations

import os

from helix_transport._exceptions import UsageError
from helix_transport.store._base import READ_LIMIT, Store
from helix_transport.store._records import (
    Checkpoint,
    RemoteCursor,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    input_fingerprint,
)
from helix_transport.store.memory import MemoryStore
from helix_transport.store.sqlite import SqliteStore

__all__ = [
    "READ_LIMIT",
    "STORE_URL_ENV",
    "Checkpoint",
    "MemoryStore",
    "RemoteCursor",
    "SessionRecord",
    "SessionUpdate",
    "SqliteStore",
    "Store",
    "SubSessionRef",
    "Usage",
    "input_fingerprint",
    "open_store",
    "store_url_from_env",
]

STORE_URL_ENV = "HELIX_STORE_URL"
"""The environment variable that names the store URL."""

_SQLITE_PREFIX = "sqlite:///"
_PLANNED_SCHEMES = ("redis", "rediss", "postgres", "postgresql")


async def open_store(url: str) -> Store:
    """Open the store ``url`` names; the caller owns it and must ``aclose()`` it.

    Supported URLs:

    - ``memory://``: a fresh ``MemoryStore`` (nothing survives the process).
    - ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``: a
      ``SqliteStore``. As in SQLAlchemy, the path is everything after the third
      slash, so a fourth slash makes it absolute. ``sqlite:///:memory:`` is an
      in-memory SQLite database.

    Raises:
        UsageError: the URL is malformed or names an unsupported backend.
        StoreUnavailable: the SQLite file cannot be opened or created.
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
    if scheme in _PLANNED_SCHEMES:
        raise UsageError(
            f"store URL {url!r}: {scheme}:// stores are not supported yet; "
            "use sqlite:///path/to/file.db or memory://"
        )
    raise UsageError(
        f"unsupported store URL {url!r}: use memory:// or sqlite:///path/to/file.db "
        "(redis:// and postgresql:// are not supported yet)"
    )


def store_url_from_env(default: str) -> str:
    """The store URL from ``HELIX_STORE_URL``, or ``default`` when unset or empty."""
    return os.environ.get(STORE_URL_ENV) or default
