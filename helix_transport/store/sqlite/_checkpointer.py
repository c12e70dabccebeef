"""Checkpointing an SQLite write-ahead log off the write path.

SQLite's automatic checkpoint runs inside the ``COMMIT`` that takes the log past
1,000 pages: that commit copies the log into the database file and, with
``synchronous = NORMAL``, syncs both files, while every append queued behind it
waits. The store's own connection turns it off (``wal_autocheckpoint = 0``) and a
``Checkpointer`` thread, on a connection of its own, checkpoints every
``interval_s`` instead. A ``PASSIVE`` checkpoint never waits for or blocks a
writer or a reader; SQLite restarts the log from its start once a checkpoint has
copied all of it, so the log stays about one interval's writes long.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

logger = logging.getLogger("helix.store")

CHECKPOINT_INTERVAL_S = 0.5
"""How often the log is copied into the database file: between two checkpoints it
holds what was written in one interval (the automatic checkpoint let it reach 1,000
pages, 4 MiB at the default page size, before it ran)."""


class Checkpointer:
    """A daemon thread checkpointing one database file's log every ``interval_s``.

    Start it with ``Checkpointer.start`` on the thread that owns the store's
    connection; stop it with ``aclose``.
    """

    def __init__(self, conn: sqlite3.Connection, path: str, interval_s: float) -> None:
        self._conn = conn
        self._path = path
        self._interval_s = interval_s
        self._stopping = threading.Event()
        # Daemon: a store never closed must not hang interpreter exit; a checkpoint
        # cut off by exit is redone by the next one (the log keeps every frame).
        self._thread = threading.Thread(
            target=self._serve, name="helix-sqlite-checkpoint", daemon=True
        )

    @classmethod
    def start(
        cls, store_conn: sqlite3.Connection, path: str, *, interval_s: float = CHECKPOINT_INTERVAL_S
    ) -> Checkpointer:
        """Open the checkpointer's own connection, then turn the automatic checkpoint
        off on ``store_conn`` (so a log is never left without either). Call it on
        ``store_conn``'s thread: it blocks on file I/O.

        Raises:
            sqlite3.Error: the second connection could not be opened.
        """
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            store_conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        checkpointer = cls(conn, path, interval_s)
        checkpointer._thread.start()
        return checkpointer

    def _serve(self) -> None:
        try:
            while not self._stopping.wait(self._interval_s):
                self._checkpoint()
            self._checkpoint()  # leave a short log behind
        finally:
            self._conn.close()

    def _checkpoint(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # a full disk, say: the next interval tries again
            logger.warning("sqlite %s: checkpoint failed: %s", self._path, exc)

    async def aclose(self) -> None:
        """Stop after one last checkpoint; returns once the thread has closed its
        connection (waited for off the event loop)."""
        self._stopping.set()
        await asyncio.to_thread(self._thread.join)
