"""Following a session: replay from the store, then tail live events from the hub
(no store round trip), falling back to the store for writers in other processes.
Readers get batches of consecutive events and never see a gap or a repeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from helix_transport._exceptions import SessionNotFound
from helix_transport.log._encoded import Pages
from helix_transport.log.hub import Batch, EventHub, Reader
from helix_transport.store import READ_LIMIT, EventNotifier, Store


async def follow(
    store: Store,
    hub: EventHub,
    session_id: str,
    *,
    from_sequence: int,
    batch_limit: int = READ_LIMIT,
    poll_interval_s: float = 0.5,
    idle_s: float | None = None,
) -> AsyncIterator[Batch]:
    """Yield batches of events with ``sequence > from_sequence`` until the terminal event.

    Replays from the store, then tails ``hub``; every ``poll_interval_s`` without a
    wake-up it re-reads the store, which covers writers in other processes. With
    ``idle_s``, an empty batch is yielded whenever ``idle_s`` passed without one
    (checked at each wake-up or poll): the caller's cue for a heartbeat.

    Raises:
        SessionNotFound: the session does not exist.
    """
    with hub.reading(session_id, from_sequence=from_sequence) as reader:
        async for batch in _follow(
            store, hub, session_id, reader, batch_limit, poll_interval_s, idle_s
        ):
            yield batch


async def _follow(
    store: Store,
    hub: EventHub,
    session_id: str,
    reader: Reader,
    batch_limit: int,
    poll_interval_s: float,
    idle_s: float | None = None,
) -> AsyncIterator[Batch]:
    last_sequence = reader.last_sequence
    force_store = False
    quiet_since = time.monotonic()
    # A heartbeat interval shorter than the poll interval shortens the waits too.
    poll_interval_s = poll_interval_s if idle_s is None else min(poll_interval_s, idle_s)
    task = asyncio.current_task()
    pages = Pages(store, session_id, batch_limit)
    try:
        while True:
            if task is not None and task.cancelling():
                # A cancellation a store call swallowed: redis-py writes each command
                # through asyncio.wait_for, which on Python 3.11 returns the write's result
                # and drops a cancel that lands as the write completes (CPython gh-86296).
                # Nothing else ends this loop, so a follower would poll forever.
                raise asyncio.CancelledError
            if idle_s is not None and time.monotonic() - quiet_since >= idle_s:
                yield Batch([])  # quiet for idle_s: a heartbeat is due
                quiet_since = time.monotonic()
            waiter = hub.waiter(session_id)
            started = pages.started(last_sequence)  # a read of the next page, in flight
            batch = None
            if not (force_store or started):
                batch = hub.since(session_id, last_sequence, batch_limit)
            if batch is not None and not batch.encoded:
                # Caught up with this process's writer: wait for its next publish, and
                # after a quiet poll interval check the store (another process may write).
                force_store = not await _wait(waiter, poll_interval_s)
                continue
            from_store = batch is None
            if batch is None:
                batch = await (started or pages.read(last_sequence))
            force_store = False
            if batch.encoded:
                last_sequence = reader.last_sequence = batch.last_sequence
                if from_store and len(batch.encoded) >= batch_limit and not batch.terminal:
                    # A reader catching up from the store: more pages likely follow. One
                    # served from the hub asks the hub again (a live reader behind a burst
                    # would otherwise re-read from the store what the hub still holds).
                    pages.prefetch(last_sequence)
                yield batch
                if batch.terminal:
                    return
                if idle_s is not None:
                    quiet_since = time.monotonic()
                continue
            record = await store.get_session(session_id)
            if record is None:
                raise SessionNotFound(session_id)
            if record.status.is_terminal and record.last_sequence <= last_sequence:
                return  # finished, and the reader already has everything
            if isinstance(store, EventNotifier):
                await _wait_either(waiter, store, session_id, last_sequence, poll_interval_s)
            else:
                await _wait(waiter, poll_interval_s)
    finally:
        pages.close()


_NOTICE_GRACE_S = 0.25
_UNWIND_S = 1.0


async def _wait_either(
    waiter: asyncio.Future[None],
    store: EventNotifier,
    session_id: str,
    last_sequence: int,
    timeout_s: float,
) -> None:
    """Wake on a local publish or on the store's notice of an append in any process."""
    deadline = time.monotonic() + timeout_s
    local = asyncio.ensure_future(asyncio.shield(waiter))
    notice = asyncio.ensure_future(
        store.wait_for_events(session_id, from_sequence=last_sequence, timeout_s=timeout_s)
    )
    waits: set[asyncio.Future[Any]] = {local, notice}
    try:
        # A notice that times out returns by itself; the grace lets it, since cancelling
        # a blocked read costs its connection (redis-py drops it): one a poll a reader.
        done, _ = await asyncio.wait(
            waits, timeout=timeout_s + _NOTICE_GRACE_S, return_when=asyncio.FIRST_COMPLETED
        )
        if notice in done and notice.exception() is not None and local not in done:
            # The store cannot wait now (its notices are down): poll, do not spin.
            await asyncio.wait({local}, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for task in waits:
            task.cancel()
        # Bounded: a blocked read that is slow to unwind (redis-py drops the connection
        # of a cancelled read) must not keep a cancelled reader from ending.
        await asyncio.wait(waits, timeout=_UNWIND_S)
        for task in waits:
            # A store error here resurfaces at the next read; retrieved so it is not
            # reported as never retrieved, now or when a slow task ends.
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _wait(waiter: asyncio.Future[None], timeout_s: float) -> bool:
    """Wait for ``waiter``; False on timeout.

    The reader awaits a future of its own, never the shared ``waiter`` (which its
    cancellation would cancel for every reader). A done-callback and a timer cost
    about half of ``asyncio.timeout`` around ``asyncio.shield``, and this runs once
    per wake-up per reader.
    """
    if waiter.done():
        return True
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[bool] = loop.create_future()

    def wake(_: object = None, value: bool = True) -> None:
        if not woken.done():
            woken.set_result(value)

    waiter.add_done_callback(wake)
    timer = loop.call_later(timeout_s, wake, None, False)
    try:
        return await woken
    finally:
        timer.cancel()
        waiter.remove_done_callback(wake)
