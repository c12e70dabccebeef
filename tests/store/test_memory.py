"""``MemoryStore`` against the store conformance suite."""

from __future__ import annotations

import dataclasses
import gc
import typing
from collections.abc import AsyncIterator

import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport.store import (
    Checkpoint,
    MemoryStore,
    SessionRecord,
    SessionUpdate,
    Store,
    SubSessionRef,
    Usage,
)
from helix_transport.store._listing import SessionQuery
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


async def test_callers_cannot_corrupt_stored_records() -> None:
    # The store copies only a record's metadata dict in and out: whatever a caller
    # does to the record it passed or got back, the stored one stays as written.
    store = MemoryStore()
    given = make_record(metadata={"team": "a"}, principal="p")
    created, _ = await store.create_session(given)
    given.metadata["team"] = "given"
    created.metadata["team"] = "created"
    got = await store.get_session("s-1")
    assert got is not None
    got.metadata["extra"] = "got"
    updated = await store.update_session("s-1", SessionUpdate(step_count=1))
    assert updated is not None
    updated.metadata.clear()
    for listed in [
        *await store.list_sessions(status=SessionStatus.RUNNING),
        *(await store.query_sessions(SessionQuery(principal="p"), limit=10)).records,
    ]:
        listed.metadata["team"] = "listed"
    again = await store.get_session("s-1")
    assert again is not None
    assert again.metadata == {"team": "a"}
    assert again.step_count == 1


def test_a_session_record_has_no_mutable_field_but_its_metadata() -> None:
    # What makes copying only ``metadata`` enough (``memory._own``): a new list or
    # dict field would be shared between the store and its callers.
    immutable = {str, int, float, bool, SessionStatus, Usage, type(None)}
    for name, hint in typing.get_type_hints(SessionRecord).items():
        if name == "metadata":
            continue
        kinds = set(typing.get_args(hint)) or {hint}
        assert kinds <= immutable, f"SessionRecord.{name} is {hint}: copy it in memory._own"
    for ref_field in dataclasses.fields(SubSessionRef):  # shared as they are
        hint = typing.get_type_hints(SubSessionRef)[ref_field.name]
        assert (set(typing.get_args(hint)) or {hint}) <= immutable, ref_field.name
    classes: list[typing.Any] = [SessionRecord, SubSessionRef, Usage]
    for frozen in classes:
        assert frozen.__dataclass_params__.frozen


async def test_a_log_holds_no_object_the_garbage_collector_tracks_per_event() -> None:
    # A tracked object per stored event (a (sequence, bytes) tuple) made the collector
    # run every few appends of a live stream, tracing each of them.
    store = MemoryStore()
    await store.create_session(make_record("s"))
    gc.collect()
    gc.disable()  # nothing untracked or freed while counting
    try:
        before = len(gc.get_objects())
        for n in range(20):
            await store.append("s", (), expected_sequence=100 * n, encoded=[b"\x62\x00"] * 100)
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert grown < 100, grown
    page = await store.read_encoded("s", from_sequence=1_950)
    assert page == [b"\x62\x00"] * 50
