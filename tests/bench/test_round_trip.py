"""Scenario 3's two sides are timed alike: each from an idle loop, and the litellm call
alone with the success handlers a session pays before its end."""

from __future__ import annotations

import asyncio
from typing import Any

from helix_transport.agent.litellm import imported
from helix_transport.bench import streams
from helix_transport.bench._measure import alternating_ms


class _Recorder:
    """A user's litellm success callback: counts the calls it saw end."""

    def __init__(self) -> None:
        from litellm.integrations.custom_logger import CustomLogger

        recorder = self

        class Recording(CustomLogger):
            async def async_log_success_event(self, *args: Any, **kwargs: Any) -> None:
                recorder.seen += 1

        self.seen = 0
        self.callback = Recording()


async def test_the_call_alone_includes_the_success_handlers_a_session_pays() -> None:
    litellm = imported()
    recorder = _Recorder()
    litellm.callbacks.append(recorder.callback)
    try:
        await streams._model_call()
        # Returned before its handlers ran: timing only this left them out.
        assert recorder.seen == 0
        await asyncio.sleep(0.05)
        assert recorder.seen == 1
        await streams._model_call_whole()
        assert recorder.seen == 2
    finally:
        litellm.callbacks.remove(recorder.callback)


async def test_each_side_starts_from_an_idle_loop() -> None:
    leftovers: list[asyncio.Task[None]] = []
    busy_at_start: list[bool] = []

    async def leaves_work() -> None:
        async def tail() -> None:  # a run's end after its client has ``completed``
            for _ in range(3):
                await asyncio.sleep(0)

        leftovers.append(asyncio.ensure_future(tail()))

    async def looks() -> None:
        busy_at_start.append(any(not task.done() for task in leftovers))

    await alternating_ms(leaves_work, looks, 3)
    assert any(busy_at_start), "back to back, the other side's tail is still running"
    busy_at_start.clear()
    await streams._alternating_settled_ms(leaves_work, looks, 3)
    assert busy_at_start == [False] * 4  # the warm-up and three timed runs
