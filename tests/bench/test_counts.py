"""``bench.counts`` counts what the mesh does, not its own driving."""

from __future__ import annotations

import asyncio

from helix_transport.bench.counts import _count_calls, _Counting
from helix_transport.store import SessionRecord
from helix_transport.store.memory import MemoryStore


async def test_each_store_call_counts_once_and_the_counting_itself_not_at_all() -> None:
    counting = _Counting(asyncio.get_running_loop())
    store = _count_calls(MemoryStore(), counting)
    record = SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="")

    async def two_calls() -> None:
        await store.create_session(record)
        await store.get_session("s")

    counts = await counting.measure(two_calls)
    assert counts["store calls"] == 2
    # The store's own Python calls, none of this module's (its wrappers, this driver).
    helix = counts["calls.helix"]
    assert helix > 0
    bare = _Counting(asyncio.get_running_loop())
    plain = MemoryStore()

    async def the_same_unwrapped() -> None:
        await plain.create_session(record)
        await plain.get_session("s")

    assert (await bare.measure(the_same_unwrapped))["calls.helix"] == helix
