"""A replica's housekeeping while its store is down: it says so once, not every pass.

The lease renewer (every third of a TTL), the interrupt watch (every poll interval)
and the orphan scan each call the store on their own; during an outage each used to
log a warning with a traceback at every pass, dozens a second with short intervals.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import pytest

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport._exceptions import StoreUnavailable
from helix_transport.store import MemoryStore
from tests.agents import counter


class Flaky(MemoryStore):
    """A store whose housekeeping calls fail while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refused = 0

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreUnavailable("memory: down for the test")

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        self._check()
        return await super().renew_leases(session_ids, owner, ttl_s=ttl_s)

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        self._check()
        return await super().pending_interrupts(session_ids)


async def test_each_housekeeping_loop_logs_an_outage_once_and_its_end(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "50")  # a run of about 2 s
    store = Flaky()
    config = ServerConfig(lease_ttl_s=3.0, poll_interval_s=0.05)
    caplog.set_level(logging.WARNING, logger="helix.runner")
    async with (
        await create_server(counter, store, config, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 4, "words": 10}), session_id="s1")
        await asyncio.sleep(0.2)
        store.down = True
        await asyncio.sleep(1.2)  # ~24 interrupt looks, one renewal (every 1 s)
        store.down = False
        final = [e async for e in client.stream("s1")]

    assert final[-1].WhichOneof("payload") == "completed"
    assert store.refused >= 10
    messages = [r.getMessage() for r in caplog.records]
    for what in ("looking for interrupts", "lease renewal"):
        failed = [m for m in messages if m.startswith(f"{what} failed")]
        again = [m for m in messages if m.startswith(f"{what} works again")]
        assert len(failed) == 1 and len(again) == 1, (what, messages)
    assert not [m for m in messages if "still failing" in m]  # reminders: after 60 s
