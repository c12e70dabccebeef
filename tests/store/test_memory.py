"""``MemoryStore`` against the store conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from helix_transport._exceptions import UsageError
from helix_transport.store import Checkpoint, MemoryStore, Store
from helix_transport.testing.store_suite import StoreConformance, make_record


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        store = MemoryStore()
        yield store
        await store.aclose()


def test_memory_store_satisfies_the_protocol() -> None:
    assert isinstance(MemoryStore(), Store)


async def test_closed_memory_store_refuses_calls() -> None:
    store = MemoryStore()
    await store.aclose()
    with pytest.raises(UsageError, match="closed"):
        await store.create_session(make_record())


async def test_checkpoint_state_must_be_json() -> None:
    # MemoryStore keeps checkpoints as JSON so tests catch what durable stores reject.
    store = MemoryStore()
    with pytest.raises(TypeError):
        await store.save_checkpoint(
            Checkpoint(session_id="s-1", step=1, messages=[], state={"bad": object()})
        )
