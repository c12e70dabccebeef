"""Waking readers in any process when a PostgreSQL store's log grows: ``LISTEN`` on the
channel every committed append ``NOTIFY``s with its session id."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from helix_transport.store.postgres._conn import Database
from helix_transport.store.postgres._errors import is_lost, map_pg_errors


class PostgresNotifier:
    """``EventNotifier`` on ``db``: one pooled connection kept for ``LISTEN`` on
    ``channel``, and the readers waiting on each session."""

    def __init__(self, db: Database, channel: str) -> None:
        self._db = db
        self._channel = channel
        self._listener: Any = None
        self._listener_lock = asyncio.Lock()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Wait for a ``NOTIFY`` about ``session_id`` (sent by every committed append)."""
        await self._ensure_listener()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(session_id, set()).add(waiter)
        try:
            # An append between the caller's last read and our LISTEN would be missed:
            # look at the log's end once the waiter is registered.
            async with self._db.connection() as conn:
                last = await conn.fetchval(
                    self._db.q("SELECT last_sequence FROM {s}.sessions WHERE session_id = $1"),
                    session_id,
                )
            if last is not None and last > from_sequence:
                return True
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter
            except TimeoutError:
                return False
            return True
        finally:
            waiting = self._waiters.get(session_id)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[session_id]

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not is_lost(self._listener):
            return
        async with self._listener_lock:
            if self._listener is not None and not is_lost(self._listener):
                return
            # A lost listener (the server restarted, or ended the connection) is gone
            # from the pool already; LISTEN again on a fresh one. Notices sent meanwhile
            # are missed: waiters fall back on their poll interval.
            self._listener = None
            with map_pg_errors(self._db.where):
                conn = await self._db.pool.acquire(timeout=self._db.acquire_timeout_s)
                try:
                    await conn.add_listener(self._channel, self._on_notify)
                except BaseException:  # cancelled too: a waiter gave up meanwhile
                    await asyncio.shield(self._db.pool.release(conn))
                    raise
            self._listener = conn

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        for waiter in self._waiters.get(payload, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def aclose(self) -> None:
        """Stop listening and give the connection back to the pool."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(Exception):
                await listener.remove_listener(self._channel, self._on_notify)
                await self._db.pool.release(listener)
