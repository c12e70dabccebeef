"""``PostgresStore``: the shared durable store, PostgreSQL through an ``asyncpg`` pool.

Everything lives in one schema (``helix`` by default), so several deployments or
test runs can share a database. The schema is created and upgraded on open by
numbered migrations, applied under a transaction-scoped advisory lock so replicas
starting together migrate it exactly once. Every ``Store`` method is one statement
or one transaction; ``append`` locks the session row, so sequences are assigned by
the database and two writers can never interleave a log.

Timestamps are seconds since the epoch in ``double precision`` columns, so floats
round-trip exactly. Leases are the exception to "the caller's clock": they are
granted and checked against the database clock, which all replicas share.
"""

from __future__ import annotations

from helix_transport._optional import requires

# Every module of this package imports asyncpg: a missing extra is named here, once.
with requires("postgres", "the PostgreSQL store (postgresql://)"):
    import asyncpg  # type: ignore[import-untyped]  # noqa: F401

from helix_transport.store.postgres._schema import SCHEMA_VERSION
from helix_transport.store.postgres._store import PostgresStore

__all__ = ["SCHEMA_VERSION", "PostgresStore"]
