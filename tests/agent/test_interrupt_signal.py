"""``InterruptSignal``: an ``asyncio.Event`` whose ``watch`` futures a step races
without a task of its own."""

from __future__ import annotations

import asyncio

from helix_transport.agent.interrupt_signal import InterruptSignal


async def test_a_watching_future_is_done_when_the_signal_is_set() -> None:
    signal = InterruptSignal()
    future = signal.watch()
    waiter = asyncio.ensure_future(signal.wait())  # still an Event to plain waiters
    await asyncio.sleep(0)
    assert not future.done() and not waiter.done()
    signal.set()
    assert future.done() and not future.cancelled()
    assert await asyncio.wait_for(waiter, 1) is True


async def test_watching_a_set_signal_is_done_at_once() -> None:
    signal = InterruptSignal()
    signal.set()
    assert signal.watch().done()


async def test_an_unwatched_future_is_left_alone() -> None:
    signal = InterruptSignal()
    kept, dropped = signal.watch(), signal.watch()
    signal.unwatch(dropped)
    dropped.cancel()
    signal.set()
    assert kept.done() and not kept.cancelled()
    assert dropped.cancelled()
    assert not signal._watching  # nothing held after the set
