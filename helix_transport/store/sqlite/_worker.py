"""The one thread that runs all of an SQLite store's work."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

_T = TypeVar("_T")

_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]
_BATCH_MAX = 64
"""Calls per loop wake-up at most, so a steady queue cannot hold results back."""
_STARVED_S = 0.005
"""A worker without progress this long while calls wait is likely waiting for the GIL (the
interpreter's switch interval). Checked every 0.5 ms and handing off at once, a saturated
service (500 paced sessions, `helix-mesh bench --scenarios 6`) lost to the hand-offs more
than its appends gained: Poisson p99 516-559 ms against 311-337 with none, alternated;
325-368 at 5 ms. Beside a loop that never idles an append then takes ~50 ms, not seconds."""
_RUNNING = 0.25
"""The share of the time since the last check that the worker's thread must have run
for its CPU to count as progress (a statement running in SQLite without the GIL)."""
_HANDOFF_S = 0.00005
"""How long the loop then sleeps, letting the worker take the GIL and get on (enough for
a waiting thread to wake; the loop gives up at most a hundredth of its time while starved)."""


class Worker:
    """One thread running submitted calls in order, waking the event loop once per batch.

    ``run_in_executor`` costs a thread wake-up and a loop wake-up (a self-pipe write,
    which drops and re-takes the GIL) per call; with hundreds of sessions each making
    store calls, this worker drains everything queued while it was busy and delivers
    all those results in one ``call_soon_threadsafe``.

    The worker re-takes the GIL after every SQLite statement, and CPython lets a busy
    event loop starve it: each time the loop polls (dropping the GIL for microseconds
    and taking it straight back) the worker's wait starts over, so it never asks the
    loop to switch. With the loop never idle, single appends took up to 40 s. So while
    calls are pending the loop checks every ``_STARVED_S``, and when the worker has
    made no progress that long it sleeps ``_HANDOFF_S`` so the worker can take the GIL.
    Progress is a call starting or ending, or the worker's thread using CPU: a long
    statement runs in SQLite without the GIL, and the loop sleeping then (every
    ``_STARVED_S`` while it runs) only cost the loop its time (a 10,000-event live
    stream on SQLite: ~40 sleeps of 0.5-1.4 ms each on a loaded host, where each
    sleep's GIL re-take waits for the worker's).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pending = 0
        """Calls submitted and not yet returned to their caller (loop thread only)."""
        self._progress_at = 0.0
        """When the worker last started or finished a call, or was handed one while idle."""
        self._watched: asyncio.AbstractEventLoop | None = None
        """The loop whose timer checks on the worker while calls are pending."""
        # Daemon: a store never closed must not hang interpreter exit; a transaction cut
        # off by exit is rolled back by SQLite, never half-written.
        self._thread = threading.Thread(target=self._serve, name="helix-sqlite", daemon=True)
        self._thread.start()
        self._clock: int | None = None
        """The worker thread's CPU clock, where the platform has one."""
        with suppress(AttributeError, OSError):  # Unix only
            assert self._thread.ident is not None
            self._clock = time.pthread_getcpuclockid(self._thread.ident)
        self._cpu_seen = 0
        """The worker thread's CPU clock at the last check (ns)."""
        self._cpu_seen_at = 0
        """When that check was (``time.monotonic_ns``)."""

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the worker thread; a cancelled caller does not stop it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((fn, done))
        if not self._pending:
            self._progress_at = time.monotonic()
        self._pending += 1
        if self._watched is not loop:  # none yet, or one on a loop that has since closed
            self._watched = loop
            loop.call_later(_STARVED_S, self._watch, loop)
        try:
            return await done
        finally:
            self._pending -= 1

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._pending or self._watched is not loop:
            if self._watched is loop:
                self._watched = None
            return
        if self._starved():
            time.sleep(_HANDOFF_S)  # a GIL hand-off (see the class docstring), not a wait
        loop.call_later(_STARVED_S, self._watch, loop)

    def _starved(self) -> bool:
        """Whether the worker made no progress for ``_STARVED_S``: no call started or
        ended, and its thread ran for less than ``_RUNNING`` of the time since the last
        check (where its clock can tell)."""
        if self._clock is not None:
            try:
                cpu = time.clock_gettime_ns(self._clock)
            except OSError:  # the thread has ended: nothing to hand off to
                return False
            now = time.monotonic_ns()
            # Some CPU is not progress: a thread waiting for the GIL wakes every switch
            # interval (5 ms) and goes back to waiting, a few µs each, which a fine-grained
            # clock counts. A statement running without the GIL takes most of the time.
            if cpu - self._cpu_seen >= (now - self._cpu_seen_at) * _RUNNING:
                self._progress_at = time.monotonic()
            self._cpu_seen, self._cpu_seen_at = cpu, now
        return time.monotonic() - self._progress_at > _STARVED_S

    def stop(self) -> None:
        """Let the thread end once the calls queued before this one have run."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
            while job is not None:
                fn, done = job
                self._progress_at = time.monotonic()
                try:
                    batch.append((done, fn(), None))
                except BaseException as exc:  # delivered to the caller, like an executor
                    batch.append((done, None, exc))
                self._progress_at = time.monotonic()
                if len(batch) >= _BATCH_MAX:  # under constant load, deliver what is done
                    break
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
            loops = {done.get_loop() for done, _, _ in batch}
            for loop in loops:
                with suppress(RuntimeError):  # that loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(
                        _deliver, [b for b in batch if b[0].get_loop() is loop]
                    )
            if job is None:
                return


def _deliver(batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for done, result, exc in batch:
        if done.done():  # its caller was cancelled
            continue
        if exc is None:
            done.set_result(result)
        else:
            done.set_exception(exc)
