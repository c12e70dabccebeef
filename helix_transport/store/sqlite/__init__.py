"""The embedded durable store: one SQLite file, safe to share between processes.

All SQLite work runs on one worker thread the store owns (``_worker``), so the event
loop never blocks on disk and the connection is only ever touched by the thread that
made it. The worker takes every call queued while it was busy and hands their results
back to the event loop in one wake-up.
Every ``Store`` method is a single transaction; writes start with ``BEGIN
IMMEDIATE`` so they take SQLite's write lock up front and stay atomic when several
processes open the same file.

The parts: ``_store`` (the ``Store`` methods), ``_worker`` (the thread), ``_conn``
(error mapping, transactions), ``_schema`` (tables, migrations, opening), ``_sessions``
(records, leases, interrupts), ``_log`` (appends and reads), ``_checkpoints``,
``_refs``, ``_outbox`` and ``_checkpointer`` (the write-ahead log, off the write path).
"""

from __future__ import annotations

from helix_transport.store.sqlite._schema import SCHEMA_VERSION
from helix_transport.store.sqlite._store import SqliteStore

__all__ = ["SCHEMA_VERSION", "SqliteStore"]
