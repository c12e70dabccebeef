"""The SQLite store's schema, its migrations and opening a connection on it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from helix_transport._exceptions import (
    StoreError,
    StoreUnavailable,
)
from helix_transport.store.sqlite import _inputs as inputs
from helix_transport.store.sqlite import _listing as listing
from helix_transport.store.sqlite import _outbox as outbox
from helix_transport.store.sqlite import _retention as retention
from helix_transport.store.sqlite._checkpointer import Checkpointer
from helix_transport.store.sqlite._conn import map_sqlite_errors, transaction

SCHEMA_VERSION = 7
"""The schema this module writes; a file with a newer version is refused."""

# Column names are the record fields' names; metadata, usage, messages and state are JSON.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, agent_type TEXT NOT NULL, input_json TEXT NOT NULL,
    input_hash TEXT NOT NULL, status TEXT NOT NULL, parent_session_id TEXT NOT NULL,
    metadata TEXT NOT NULL, output_json TEXT NOT NULL, error TEXT NOT NULL,
    failure_reason TEXT NOT NULL, step_count INTEGER NOT NULL, usage TEXT NOT NULL,
    last_sequence INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    finished_at REAL, owner TEXT NOT NULL, lease_expires_at REAL NOT NULL
);
-- Startup scans for RUNNING sessions to resume.
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL, sequence INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (session_id, sequence)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    session_id TEXT PRIMARY KEY, step INTEGER NOT NULL, messages TEXT NOT NULL,
    usage TEXT NOT NULL, last_sequence INTEGER NOT NULL, state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS interrupts (session_id TEXT PRIMARY KEY, reason TEXT NOT NULL);
-- position keeps the order refs were first stored, remote_* are NULL for a local child.
CREATE TABLE IF NOT EXISTS subsession_refs (
    parent_session_id TEXT NOT NULL, child_session_id TEXT NOT NULL,
    position INTEGER NOT NULL, agent_type TEXT NOT NULL, tool_call_id TEXT NOT NULL,
    status TEXT NOT NULL, address TEXT NOT NULL, started_at REAL NOT NULL,
    completed_at REAL, remote_stream_id TEXT, remote_last_sequence INTEGER,
    output_json TEXT NOT NULL, error TEXT NOT NULL, failure_reason TEXT NOT NULL,
    PRIMARY KEY (parent_session_id, child_session_id)
);
"""

# What takes a file of version N - 1 to N (the version 1 schema is _SCHEMA above).
# Never edit a released upgrade: append one.
_UPGRADES: dict[int, tuple[str, ...]] = {
    # 2: sessions belong to the principal (and tenant) that started them.
    2: (
        "ALTER TABLE sessions ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
    ),
    # 3: the outbox of commands for children (interrupts a child's service must take).
    3: outbox.UPGRADE,
    # 4: retention (an index of finished sessions by their end, tombstones).
    4: retention.UPGRADE,
    # 5: an index on (owner, created_at) for ListSessions.
    5: listing.UPGRADE,
    # 6: people's answers to requests for input; interrupts that abort.
    6: inputs.UPGRADE,
    # 7: a session's limits (StartRequest.limits) and which one ended it.
    7: (
        "ALTER TABLE sessions ADD COLUMN deadline REAL",
        "ALTER TABLE sessions ADD COLUMN budget_tokens INTEGER",
        "ALTER TABLE sessions ADD COLUMN budget_usd REAL",
        "ALTER TABLE sessions ADD COLUMN limit_exceeded TEXT NOT NULL DEFAULT ''",
    ),
}
# A batch's plain appends as one statement: a row inserted into this view checks its
# session's fence, moves the log's end and stores the event, all inside SQLite. TEMP: it
# lives on the store's own connection only, so the file's schema (and any other process
# on it) is untouched. A missed fence aborts the whole statement, leaving nothing.
_APPEND_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS helix_appends (session_id, sequence, data) AS "
    "SELECT session_id, sequence, data FROM main.events WHERE 0",
    """CREATE TEMP TRIGGER IF NOT EXISTS helix_append INSTEAD OF INSERT ON helix_appends BEGIN
    SELECT RAISE(ABORT, 'helix: the log does not end where its writer expected')
    WHERE NOT EXISTS (
        SELECT 1 FROM sessions
        WHERE session_id = NEW.session_id AND last_sequence = NEW.sequence - 1
    );
    UPDATE sessions SET last_sequence = NEW.sequence WHERE session_id = NEW.session_id;
    INSERT INTO events (session_id, sequence, data) VALUES (NEW.session_id, NEW.sequence, NEW.data);
END""",
)


def start_checkpointer(conn: sqlite3.Connection, path: str) -> Checkpointer:
    with map_sqlite_errors():
        return Checkpointer.start(conn, path)


def connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    if path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the directory for {path!r}: {exc}") from exc
    with map_sqlite_errors():
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so the module's
        # implicit transactions cannot split or widen ours.
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable in WAL mode except for the last commits on power loss.
            conn.execute("PRAGMA synchronous = NORMAL")
            _ensure_schema(conn)
            for statement in _APPEND_VIEW:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    # In one write transaction so two processes opening a new file don't race.
    with transaction(conn):
        # Not executescript(): it would COMMIT the transaction we are in.
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        version = row[0]
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}; this helix-mesh "
                f"understands up to {SCHEMA_VERSION}: upgrade helix-mesh"
            )
        # A new file has just been given the version 1 schema: upgrade it like an old one.
        for target in range((version or 1) + 1, SCHEMA_VERSION + 1):
            for statement in _UPGRADES[target]:
                conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
