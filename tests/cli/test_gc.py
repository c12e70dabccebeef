"""``helix-mesh gc STORE_URL``, run as a real process on an SQLite file."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from helix_transport._events import SessionStatus
from helix_transport.store import SessionUpdate, SqliteStore
from helix_transport.testing.store_suite import make_event, make_record
from tests.cli.test_cli import cli


async def _store_with(path: Path) -> None:
    """Sessions "old-1", "old-2" (ended two hours ago), "recent" and "running"."""
    async with await SqliteStore.open(str(path)) as store:
        for session_id in ("old-1", "old-2", "recent", "running"):
            await store.create_session(make_record(session_id))
        for session_id in ("old-1", "old-2", "recent"):
            await store.append(
                session_id,
                [make_event("done", session_id=session_id)],
                expected_sequence=0,
                update=SessionUpdate(status=SessionStatus.COMPLETED),
            )
    with sqlite3.connect(path) as conn:  # their end, moved back behind the store's back
        conn.execute(
            "UPDATE sessions SET finished_at = ? WHERE session_id LIKE 'old-%'",
            (time.time() - 7200,),
        )


async def _ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT session_id FROM sessions ORDER BY 1")]


async def test_gc_dry_run_then_removes_the_expired_sessions(tmp_path: Path) -> None:
    path = tmp_path / "helix.db"
    await _store_with(path)
    url = f"sqlite:///{path}"

    code, out, err = await cli("gc", url, "--retention", "1h", "--dry-run")
    assert code == 0, err
    assert out.splitlines() == [
        "would remove old-1",
        "would remove old-2",
        "would remove 2 session(s) finished more than 1:00:00 ago",
    ]
    assert await _ids(path) == ["old-1", "old-2", "recent", "running"]

    code, out, err = await cli("gc", url, "--retention", "60m")
    assert code == 0, err
    assert out.splitlines()[-1] == "removed 2 session(s) finished more than 1:00:00 ago"
    assert await _ids(path) == ["recent", "running"]
    with sqlite3.connect(path) as conn:
        old_events = "SELECT COUNT(*) FROM events WHERE session_id LIKE 'old-%'"
        assert conn.execute(old_events).fetchone() == (0,)
        assert conn.execute("SELECT session_id FROM tombstones ORDER BY 1").fetchall() == [
            ("old-1",),
            ("old-2",),
        ]

    code, out, _ = await cli("gc", url, "--retention", "1h")
    assert code == 0 and out.splitlines() == ["removed 0 session(s) finished more than 1:00:00 ago"]


async def test_gc_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'helix.db'}"
    code, _, err = await cli("gc", url)
    assert code == 2 and "--retention or set HELIX_RETENTION" in err
    code, _, err = await cli("gc", "ftp://host/x", "--retention", "7d")
    assert code == 2 and "neither a store URL" in err
    code, _, err = await cli("gc", url, "--retention", "soon")
    assert code == 2 and "'soon' is not a duration" in err
