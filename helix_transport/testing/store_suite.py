"""A conformance suite every ``Store`` backend must pass.

Subclass ``StoreConformance`` in a test module (its name must start with ``Test``)
and provide a ``store`` fixture that yields a fresh, empty store::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self) -> AsyncIterator[Store]:
            store = await MyStore.open(...)
            yield store
            await store.aclose()

Backends whose data outlives one store object (a restarted process, another
replica) subclass ``DurableStoreConformance`` instead and also provide ``reopen``:
an async callable opening a new instance on the same data.

The tests only use the ``Store`` Protocol, so they pin down behaviour, not storage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._status import SessionStatus
from helix_transport.store._base import (
    READ_LIMIT,
    CheckpointStore,
    ChildRefStore,
    EventLogStore,
    InterruptLookup,
    InterruptStore,
    LeaseStore,
    OutboxStore,
    SessionStore,
    Store,
)
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    RemoteCursor,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    input_fingerprint,
)

__all__ = [
    "DurableStoreConformance",
    "Reopen",
    "StoreConformance",
    "make_command",
    "make_event",
    "make_record",
]

Reopen = Callable[[], Awaitable[Store]]
"""Opens a new store instance on the same data as the ``store`` fixture's."""


def make_record(session_id: str = "s-1", **overrides: Any) -> SessionRecord:
    """A valid RUNNING session record; ``overrides`` replace any field."""
    input_json = overrides.pop("input_json", '{"topic": "tides"}')
    fields: dict[str, Any] = {
        "session_id": session_id,
        "agent_type": "researcher",
        "input_json": input_json,
        "input_hash": input_fingerprint(input_json),
    }
    return SessionRecord(**(fields | overrides))


def make_event(text: str, *, session_id: str = "s-1") -> StreamEvent:
    """A ``text_delta`` event carrying ``text``, with no sequence yet."""
    event = StreamEvent(session_id=session_id, agent_type="researcher", step=1)
    event.text_delta.text = text
    return event


def make_command(
    parent_session_id: str, child_session_id: str, /, **overrides: Any
) -> ChildCommand:
    """An interrupt of ``child_session_id`` at ``summarizer:50051``; ``overrides``
    replace any field."""
    fields: dict[str, Any] = {
        "parent_session_id": parent_session_id,
        "child_session_id": child_session_id,
        "address": "summarizer:50051",
    }
    return ChildCommand(**(fields | overrides))


def _texts(events: list[StreamEvent]) -> list[str]:
    return [e.text_delta.text for e in events]


async def _append_racing(store: Store, session_id: str, event: StreamEvent, *, end: int) -> int:
    """Append ``event`` at the log's end, guessed to be ``end``: a writer that loses the
    race to another is told where the log ends now, and tries again there."""
    while True:
        try:
            return await store.append(session_id, [event], expected_sequence=end)
        except SequenceConflict as conflict:
            assert event.sequence == 0  # a missed fence numbers nothing
            end = conflict.actual


def _sequences(events: list[StreamEvent]) -> list[int]:
    return [e.sequence for e in events]


class StoreConformance:
    """The ``Store`` contract as tests; needs a ``store`` fixture (see module docstring)."""

    # Lets the suite run in projects whose pytest-asyncio is in strict mode.
    pytestmark = pytest.mark.asyncio

    # --- sessions -----------------------------------------------------------------

    async def test_create_and_get_round_trip_every_field(self, store: Store) -> None:
        record = make_record(
            "s-full",
            status=SessionStatus.FAILED,
            parent_session_id="s-parent",
            metadata={"tenant": "acme", "ünïcode": "✓"},
            output_json='{"partial": true}',
            error="model refused",
            failure_reason="model_error",
            step_count=7,
            usage=Usage(prompt_tokens=11, completion_tokens=22, total_tokens=33),
            created_at=1_700_000_000.25,
            updated_at=1_700_000_123.5,
            finished_at=1_700_000_124.75,
            owner="replica-1",
            lease_expires_at=1_700_000_200.125,
            principal="alice",
            tenant="acme",
        )
        stored, created = await store.create_session(record)
        assert created is True
        assert stored == record
        assert await store.get_session("s-full") == record
        assert await store.get_session("s-missing") is None

    async def test_returned_records_are_copies(self, store: Store) -> None:
        await store.create_session(make_record(metadata={"k": "v"}))
        got = await store.get_session("s-1")
        assert got is not None
        got.metadata["k"] = "changed"
        again = await store.get_session("s-1")
        assert again is not None and again.metadata == {"k": "v"}

    async def test_concurrent_creators_exactly_one_wins(self, store: Store) -> None:
        records = [make_record("s-race", input_json=f'{{"n": {n}}}') for n in range(20)]
        results = await asyncio.gather(*(store.create_session(r) for r in records))
        winners = [stored for stored, created in results if created]
        assert len(winners) == 1
        assert all(stored == winners[0] for stored, _ in results)
        assert await store.get_session("s-race") == winners[0]

    async def test_recreate_returns_existing_record(self, store: Store) -> None:
        original = make_record(input_json='{"a": 1}')
        await store.create_session(original)
        stored, created = await store.create_session(make_record(input_json='{"a": 2}'))
        assert created is False
        assert stored == original
        assert await store.get_session("s-1") == original

    async def test_update_session(self, store: Store) -> None:
        await store.create_session(make_record(created_at=1.0, updated_at=1.0))
        before = time.time()
        update = SessionUpdate(status=SessionStatus.COMPLETED, output_json='{"ok": 1}')
        updated = await store.update_session("s-1", update)
        assert updated is not None
        assert updated.status is SessionStatus.COMPLETED
        assert updated.output_json == '{"ok": 1}'
        assert updated.updated_at >= before
        assert updated.finished_at is not None and updated.finished_at >= before
        assert updated.created_at == 1.0
        assert await store.get_session("s-1") == updated

    async def test_the_starting_principal_stays_with_the_session(self, store: Store) -> None:
        # Ownership is set once, by create_session: a second creator (another principal
        # racing for the same id) gets the first one's record back, and nothing that
        # writes the session later (updates, appends, leases) changes its owner.
        mine = make_record("s-owned", principal="alice", tenant="acme")
        theirs = make_record("s-owned", principal="mallory", tenant="globex")
        assert (await store.create_session(mine)) == (mine, True)
        stored, created = await store.create_session(theirs)
        assert created is False and (stored.principal, stored.tenant) == ("alice", "acme")
        await store.update_session("s-owned", SessionUpdate(status=SessionStatus.COMPLETED))
        await store.append(
            "s-owned",
            [make_event("x", session_id="s-owned")],
            expected_sequence=0,
            update=SessionUpdate(step_count=2),
        )
        assert await store.acquire_lease("s-owned", "replica-1", ttl_s=5)
        got = await store.get_session("s-owned")
        assert got is not None and (got.principal, got.tenant) == ("alice", "acme")
        (listed,) = [
            r
            for r in await store.list_sessions(status=SessionStatus.COMPLETED)
            if r.session_id == "s-owned"
        ]
        assert (listed.principal, listed.tenant) == ("alice", "acme")

    async def test_update_session_with_expected_status(self, store: Store) -> None:
        await store.create_session(make_record())
        matched = await store.update_session(
            "s-1", SessionUpdate(step_count=3), expected_status=SessionStatus.RUNNING
        )
        assert matched is not None and matched.step_count == 3
        before = await store.get_session("s-1")
        missed = await store.update_session(
            "s-1",
            SessionUpdate(status=SessionStatus.TERMINATED, step_count=9),
            expected_status=SessionStatus.INTERRUPTED,
        )
        assert missed is None
        assert await store.get_session("s-1") == before

    async def test_unknown_session_raises_not_found(self, store: Store) -> None:
        with pytest.raises(SessionNotFound) as update_error:
            await store.update_session("s-nope", SessionUpdate(step_count=1))
        assert update_error.value.session_id == "s-nope"
        with pytest.raises(SessionNotFound) as append_error:
            await store.append("s-nope", [make_event("x")], expected_sequence=0)
        assert append_error.value.session_id == "s-nope"
        assert await store.get_session("s-nope") is None

    async def test_list_sessions_by_status(self, store: Store) -> None:
        for n in range(3):
            await store.create_session(make_record(f"run-{n}"))
        for n in range(2):
            await store.create_session(make_record(f"done-{n}", status=SessionStatus.COMPLETED))
        running = await store.list_sessions(status=SessionStatus.RUNNING)
        assert sorted(r.session_id for r in running) == ["run-0", "run-1", "run-2"]
        assert all(r.status is SessionStatus.RUNNING for r in running)
        done = await store.list_sessions(status=SessionStatus.COMPLETED)
        assert sorted(r.session_id for r in done) == ["done-0", "done-1"]
        assert await store.list_sessions(status=SessionStatus.INTERRUPTED) == []

    # --- the event log ------------------------------------------------------------

    async def test_append_assigns_gapless_sequences(self, store: Store) -> None:
        await store.create_session(make_record())
        first = [make_event(t) for t in "abc"]
        assert await store.append("s-1", first, expected_sequence=0) == 3
        assert _sequences(first) == [1, 2, 3]
        second = [make_event(t) for t in "de"]
        assert await store.append("s-1", second, expected_sequence=3) == 5
        assert _sequences(second) == [4, 5]
        log = await store.read("s-1")
        assert _sequences(log) == [1, 2, 3, 4, 5]
        assert _texts(log) == list("abcde")
        record = await store.get_session("s-1")
        assert record is not None and record.last_sequence == 5

    async def test_the_store_plays_every_role(self, store: Store) -> None:
        roles = (
            SessionStore,
            EventLogStore,
            CheckpointStore,
            InterruptStore,
            ChildRefStore,
            OutboxStore,
            LeaseStore,
        )
        assert all(issubclass(Store, role) for role in roles)
        assert [role.__name__ for role in roles if not isinstance(store, role)] == []
        assert isinstance(store, Store)

    async def test_every_append_is_fenced(self, store: Store) -> None:
        # No append without expected_sequence: a second writer is always detected.
        await store.create_session(make_record())
        fence = inspect.signature(store.append).parameters["expected_sequence"]
        assert fence.default is inspect.Parameter.empty
        with pytest.raises(TypeError, match="expected_sequence"):
            await store.append("s-1", [make_event("a")])  # type: ignore[call-arg]
        assert await store.read("s-1") == []

    async def test_concurrent_appenders_never_collide(self, store: Store) -> None:
        # Every append is fenced: a writer that loses the race is told where the log
        # ends and tries again there, so no two events ever share a sequence.
        await store.create_session(make_record())
        assigned: dict[int, str] = {}

        async def writer(w: int) -> None:
            end = 0
            for i in range(20):
                event = make_event(f"w{w}-{i}")
                end = await _append_racing(store, "s-1", event, end=end)
                assert end == event.sequence
                assigned[event.sequence] = event.text_delta.text

        await asyncio.gather(*(writer(w) for w in range(10)))
        log = await store.read("s-1")
        assert _sequences(log) == list(range(1, 201))
        assert {e.sequence: e.text_delta.text for e in log} == assigned
        assert sorted(_texts(log)) == sorted(f"w{w}-{i}" for w in range(10) for i in range(20))
        for w in range(10):  # each writer's own events stay in its order
            mine = [t for t in _texts(log) if t.startswith(f"w{w}-")]
            assert mine == [f"w{w}-{i}" for i in range(20)]
        record = await store.get_session("s-1")
        assert record is not None and record.last_sequence == 200

    async def test_a_failed_append_fails_alone(self, store: Store) -> None:
        # Appends issued together (a store may commit them in one transaction): a
        # stale fence and a missing session fail only their own append.
        for session_id in ("s-1", "s-2", "s-3"):
            await store.create_session(make_record(session_id))
        await store.append("s-1", [make_event("a")], expected_sequence=0)
        stale = [make_event("stale"), make_event("stale too")]
        results = await asyncio.gather(
            store.append("s-2", [make_event("x", session_id="s-2")], expected_sequence=0),
            store.append("s-1", stale, expected_sequence=0),
            store.append("nobody", [make_event("lost", session_id="nobody")], expected_sequence=0),
            store.append(
                "s-3", [make_event(t, session_id="s-3") for t in "yz"], expected_sequence=0
            ),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[3] == 2
        assert isinstance(results[1], SequenceConflict) and results[1].actual == 1
        assert isinstance(results[2], SessionNotFound)
        assert _sequences(stale) == [0, 0]
        assert _texts(await store.read("s-1")) == ["a"]
        assert _texts(await store.read("s-2")) == ["x"]
        assert _texts(await store.read("s-3")) == ["y", "z"]
        for session_id, last in (("s-1", 1), ("s-2", 1), ("s-3", 2)):
            record = await store.get_session(session_id)
            assert record is not None and record.last_sequence == last

    async def test_a_value_the_store_cannot_hold_fails_its_append_alone(self, store: Store) -> None:
        # A value one backend refuses (a step count past 64 bits) fails its own append,
        # never the others' committed with it, and leaves its session as it was.
        for session_id in ("s-1", "s-2", "s-3"):
            await store.create_session(make_record(session_id))
        results = await asyncio.gather(
            store.append("s-1", [make_event("a")], expected_sequence=0),
            store.append(
                "s-2",
                [make_event("b", session_id="s-2")],
                expected_sequence=0,
                update=SessionUpdate(step_count=2**70),
            ),
            store.append(
                "s-3",
                [make_event("c", session_id="s-3")],
                expected_sequence=0,
                update=SessionUpdate(step_count=1),
            ),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[2] == 1
        assert _texts(await store.read("s-1")) == ["a"]
        assert _texts(await store.read("s-3")) == ["c"]
        refused = await store.get_session("s-2")
        assert refused is not None
        if isinstance(results[1], StoreError):
            assert await store.read("s-2") == [] and refused.last_sequence == 0
            assert refused.step_count == 0
        else:
            assert results[1] == 1 and refused.step_count == 2**70

    async def test_free_text_is_stored_as_every_backend_can_hold_it(self, store: Store) -> None:
        # NUL (PostgreSQL's text refuses it) and lone surrogates (not UTF-8) in an error
        # made of someone else's message: replaced, the same on every backend.
        await store.create_session(make_record())
        odd = "bad\x00byte, lone \ud800"
        updated = await store.update_session(
            "s-1", SessionUpdate(status=SessionStatus.FAILED, error=odd, failure_reason=odd)
        )
        assert updated is not None and updated.error == "bad\ufffdbyte, lone \ufffd"
        assert await store.get_session("s-1") == updated
        ref = SubSessionRef(
            parent_session_id="s-1",
            child_session_id="c",
            agent_type="a",
            tool_call_id="call-1",
            status=SessionStatus.FAILED,
            error=odd,
            failure_reason=odd,
        )
        assert ref.error == ref.failure_reason == "bad\ufffdbyte, lone \ufffd"
        await store.put_subsession_ref(ref)
        assert await store.list_subsession_refs("s-1") == [ref]

    async def test_large_events_read_back_whole_and_in_order(self, store: Store) -> None:
        # 12 MiB in all: a store may return fewer than ``limit`` per read, never none
        # while events remain, and never out of order.
        await store.create_session(make_record())
        for i in range(6):
            await store.append("s-1", [make_event(f"{i}" * (2 << 20))], expected_sequence=i)
        seen: list[StreamEvent] = []
        while len(seen) < 6:
            batch = await store.read("s-1", from_sequence=len(seen))
            assert batch, f"a read after {len(seen)} returned nothing"
            seen += batch
        assert _sequences(seen) == [1, 2, 3, 4, 5, 6]
        assert [e.text_delta.text[:1] for e in seen] == list("012345")
        assert all(len(e.text_delta.text) == 2 << 20 for e in seen)

    async def test_append_keeps_the_writers_encoded_events(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append("s-1", [make_event("a")], expected_sequence=0)
        events = [make_event("b"), make_event("c")]
        for sequence, event in enumerate(events, start=2):
            event.sequence = sequence  # as the event log's writer serializes them
        encoded = [event.SerializeToString() for event in events]
        update = SessionUpdate(step_count=1)
        assert (
            await store.append("s-1", events, expected_sequence=1, update=update, encoded=encoded)
            == 3
        )
        assert _sequences(events) == [2, 3]
        read = await store.read("s-1")
        assert [e.SerializeToString() for e in read[1:]] == encoded
        assert _texts(read) == ["a", "b", "c"]
        record = await store.get_session("s-1")
        assert record is not None and (record.last_sequence, record.step_count) == (3, 1)
        stale = [make_event("stale")]
        stale[0].sequence = 3
        with pytest.raises(SequenceConflict):
            await store.append(
                "s-1", stale, expected_sequence=2, encoded=[stale[0].SerializeToString()]
            )
        assert _texts(await store.read("s-1")) == ["a", "b", "c"]

    async def test_append_of_bytes_alone(self, store: Store) -> None:
        # The event log's writer hands over bytes only: no message objects to number.
        await store.create_session(make_record())
        encoded = [make_event(text) for text in "ab"]
        for sequence, event in enumerate(encoded, start=1):
            event.sequence = sequence
        data = [event.SerializeToString() for event in encoded]
        assert await store.append("s-1", (), expected_sequence=0, encoded=data) == 2
        read = await store.read("s-1")
        assert [e.SerializeToString() for e in read] == data
        record = await store.get_session("s-1")
        assert record is not None and record.last_sequence == 2
        with pytest.raises(SequenceConflict):  # the fence still holds
            await store.append("s-1", (), expected_sequence=1, encoded=data[:1])
        with pytest.raises(UsageError, match="1 events but 2 encoded"):
            await store.append("s-1", [make_event("c")], expected_sequence=2, encoded=data)
        assert _texts(await store.read("s-1")) == ["a", "b"]

    async def test_expected_sequence_conflict_writes_nothing(self, store: Store) -> None:
        await store.create_session(make_record())
        assert await store.append("s-1", [make_event("a")], expected_sequence=0) == 1
        assert await store.append("s-1", [make_event("b")], expected_sequence=1) == 2
        stale = [make_event("stale")]
        terminal = SessionUpdate(status=SessionStatus.FAILED, error="stale writer")
        with pytest.raises(SequenceConflict) as conflict:
            await store.append("s-1", stale, expected_sequence=1, update=terminal)
        assert (conflict.value.session_id, conflict.value.expected) == ("s-1", 1)
        assert conflict.value.actual == 2
        assert stale[0].sequence == 0
        assert _texts(await store.read("s-1")) == ["a", "b"]
        record = await store.get_session("s-1")
        assert record is not None
        assert (record.last_sequence, record.status, record.error) == (
            2,
            SessionStatus.RUNNING,
            "",
        )

    async def test_append_with_update_is_atomic(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append("s-1", [make_event("thinking")], expected_sequence=0)
        done = StreamEvent(session_id="s-1", agent_type="researcher", step=1)
        done.completed.output_json = '{"answer": 42}'
        update = SessionUpdate(status=SessionStatus.COMPLETED, output_json='{"answer": 42}')
        assert await store.append("s-1", [done], expected_sequence=1, update=update) == 2
        record = await store.get_session("s-1")
        assert record is not None
        assert record.status is SessionStatus.COMPLETED
        assert record.output_json == '{"answer": 42}'
        assert record.finished_at is not None
        assert record.last_sequence == 2
        log = await store.read("s-1")
        assert log[-1].WhichOneof("payload") == "completed"
        assert log[-1].completed.output_json == '{"answer": 42}'

    async def test_each_turns_end_stamps_finished_at(self, store: Store) -> None:
        # A continued session ends once per turn; finished_at is the latest end, whichever
        # write brings it (a plain update, or an append carrying the terminal event).
        await store.create_session(make_record())
        first = await store.update_session("s-1", SessionUpdate(status=SessionStatus.COMPLETED))
        assert first is not None and first.finished_at is not None
        await asyncio.sleep(0.01)  # past the clock's resolution on every backend
        await store.update_session("s-1", SessionUpdate(status=SessionStatus.RUNNING))
        done = StreamEvent(session_id="s-1", agent_type="researcher", step=2)
        done.completed.output_json = "{}"
        update = SessionUpdate(status=SessionStatus.COMPLETED, output_json="{}")
        await store.append("s-1", [done], expected_sequence=0, update=update)
        second = await store.get_session("s-1")
        assert second is not None and second.finished_at is not None
        assert second.finished_at > first.finished_at
        await asyncio.sleep(0.01)
        await store.update_session("s-1", SessionUpdate(status=SessionStatus.RUNNING))
        third = await store.update_session("s-1", SessionUpdate(status=SessionStatus.FAILED))
        assert third is not None and third.finished_at is not None
        assert third.finished_at > second.finished_at

    async def test_stored_events_are_copies(self, store: Store) -> None:
        await store.create_session(make_record())
        event = make_event("original")
        await store.append("s-1", [event], expected_sequence=0)
        event.text_delta.text = "mutated after append"
        first = await store.read("s-1")
        first[0].text_delta.text = "mutated after read"
        assert _texts(await store.read("s-1")) == ["original"]

    async def test_read_ranges_and_limits(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append("s-1", [make_event(f"e{n}") for n in range(1, 6)], expected_sequence=0)
        everything = await store.read("s-1", from_sequence=0)
        assert _sequences(everything) == [1, 2, 3, 4, 5]
        assert _texts(everything) == ["e1", "e2", "e3", "e4", "e5"]
        assert all(e.session_id == "s-1" and e.step == 1 for e in everything)
        middle = await store.read("s-1", from_sequence=2)
        assert (_sequences(middle), _texts(middle)) == ([3, 4, 5], ["e3", "e4", "e5"])
        assert await store.read("s-1", from_sequence=5) == []
        assert await store.read("s-1", from_sequence=99) == []
        assert _sequences(await store.read("s-1", from_sequence=1, limit=2)) == [2, 3]
        assert _sequences(await store.read("s-1", limit=1)) == [1]

    async def test_read_returns_at_most_read_limit(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append(
            "s-1", [make_event(str(n)) for n in range(READ_LIMIT + 5)], expected_sequence=0
        )
        page = await store.read("s-1", limit=READ_LIMIT * 2)
        assert _sequences(page) == list(range(1, READ_LIMIT + 1))
        rest = await store.read("s-1", from_sequence=READ_LIMIT)
        assert _sequences(rest) == list(range(READ_LIMIT + 1, READ_LIMIT + 6))

    # --- checkpoints, interrupts, sub-session refs ---------------------------------

    async def test_checkpoint_save_replace_load(self, store: Store) -> None:
        assert await store.load_checkpoint("s-1") is None
        first = Checkpoint(
            session_id="s-1",
            step=2,
            messages=[
                {"role": "user", "content": "tides?"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "args": {"n": [1, 2.5]}}]},
            ],
            usage=Usage(prompt_tokens=5, completion_tokens=6, total_tokens=11),
            last_sequence=9,
            state={"pending": ["c1"], "nested": {"flag": True, "none": None}},
        )
        await store.save_checkpoint(first)
        assert await store.load_checkpoint("s-1") == first
        second = Checkpoint(session_id="s-1", step=3, messages=[{"role": "user"}])
        await store.save_checkpoint(second)
        assert await store.load_checkpoint("s-1") == second
        assert await store.load_checkpoint("s-other") is None

    async def test_append_carries_a_checkpoint(self, store: Store) -> None:
        # A step's events, its record update and its checkpoint in one append.
        await store.create_session(make_record())
        checkpoint = Checkpoint(
            session_id="s-1", step=1, messages=[{"role": "user", "content": "x"}], last_sequence=2
        )
        update = SessionUpdate(step_count=1)
        events = [make_event("a"), make_event("b")]
        assert (
            await store.append(
                "s-1", events, expected_sequence=0, update=update, checkpoint=checkpoint
            )
            == 2
        )
        assert await store.load_checkpoint("s-1") == checkpoint
        record = await store.get_session("s-1")
        assert record is not None and (record.last_sequence, record.step_count) == (2, 1)
        # Without a record update too.
        later = Checkpoint(session_id="s-1", step=2, messages=[], last_sequence=3)
        await store.append("s-1", [make_event("c")], expected_sequence=2, checkpoint=later)
        assert await store.load_checkpoint("s-1") == later
        # No events: the update and the checkpoint alone, still fenced.
        idle = Checkpoint(session_id="s-1", step=3, messages=[], last_sequence=3)
        update = SessionUpdate(step_count=3)
        await store.append(
            "s-1", (), expected_sequence=3, encoded=[], update=update, checkpoint=idle
        )
        assert await store.load_checkpoint("s-1") == idle
        record = await store.get_session("s-1")
        assert record is not None and (record.last_sequence, record.step_count) == (3, 3)
        later = idle
        # Refused before anything is written: not where the append ends.
        stray = Checkpoint(session_id="s-1", step=9, messages=[], last_sequence=5)
        with pytest.raises(UsageError, match="the append ends the log at 4"):
            await store.append("s-1", [make_event("d")], expected_sequence=3, checkpoint=stray)
        # Another session's checkpoint, fenced by this log, would land beside or over it.
        theirs = Checkpoint(session_id="s-2", step=4, messages=[], last_sequence=4)
        with pytest.raises(UsageError, match="the checkpoint is session 's-2'"):
            await store.append("s-1", [make_event("d")], expected_sequence=3, checkpoint=theirs)
        assert await store.load_checkpoint("s-2") is None
        # A fence that misses stores neither the events nor the checkpoint.
        with pytest.raises(SequenceConflict):
            await store.append("s-1", [make_event("d")], expected_sequence=4, checkpoint=stray)
        assert _texts(await store.read("s-1")) == ["a", "b", "c"]
        assert await store.load_checkpoint("s-1") == later

    async def test_a_checkpoint_that_is_not_json_fails_its_append_alone(self, store: Store) -> None:
        # A tool left a set in its state: that append raises and stores nothing (not its
        # events nor its record update), and appends beside it are not touched.
        await store.create_session(make_record("s-1"))
        await store.create_session(make_record("s-2"))
        bad = Checkpoint(
            session_id="s-1", step=1, messages=[], last_sequence=1, state={"seen": {1, 2}}
        )
        update = SessionUpdate(status=SessionStatus.COMPLETED)
        outcomes = await asyncio.gather(
            store.append(
                "s-1", [make_event("a")], expected_sequence=0, update=update, checkpoint=bad
            ),
            store.append("s-2", [make_event("b", session_id="s-2")], expected_sequence=0),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], TypeError) and outcomes[1] == 1, outcomes
        record = await store.get_session("s-1")
        assert record is not None
        assert (record.status, record.last_sequence) == (SessionStatus.RUNNING, 0)
        assert await store.read("s-1") == [] and await store.load_checkpoint("s-1") is None
        assert _texts(await store.read("s-2")) == ["b"]

    async def test_checkpoint_is_fenced_by_the_log(self, store: Store) -> None:
        await store.create_session(make_record("s-1"))
        await store.append("s-1", [make_event("a"), make_event("b")], expected_sequence=0)
        current = Checkpoint(session_id="s-1", step=1, messages=[], last_sequence=2)
        await store.save_checkpoint(current)
        await store.append(
            "s-1", [make_event("c")], expected_sequence=2
        )  # a new owner moved the log on
        stale = Checkpoint(session_id="s-1", step=9, messages=[], last_sequence=2)
        with pytest.raises(SequenceConflict) as info:
            await store.save_checkpoint(stale)
        assert (info.value.expected, info.value.actual) == (2, 3)
        assert await store.load_checkpoint("s-1") == current

    async def test_interrupt_set_and_take(self, store: Store) -> None:
        assert await store.take_interrupt("s-1") is None
        await store.set_interrupt("s-1", "user pressed stop")
        assert await store.take_interrupt("s-2") is None
        assert await store.take_interrupt("s-1") == "user pressed stop"
        assert await store.take_interrupt("s-1") is None
        await store.set_interrupt("s-1", "")
        assert await store.take_interrupt("s-1") == ""
        assert await store.take_interrupt("s-1") is None

    async def test_pending_interrupts_names_the_sessions_with_one_untaken(
        self, store: Store
    ) -> None:
        if not isinstance(store, InterruptLookup):  # optional; every built-in store has it
            assert not type(store).__module__.startswith("helix_transport."), type(store)
            pytest.skip("no pending_interrupts: an Interrupt on another replica waits a step")
        assert await store.pending_interrupts([]) == set()
        await store.set_interrupt("s-1", "stop")
        await store.set_interrupt("s-3", "")
        assert await store.pending_interrupts(["s-1", "s-2", "s-3", "s-1"]) == {"s-1", "s-3"}
        assert await store.take_interrupt("s-1") == "stop"  # looking took nothing
        assert await store.pending_interrupts(["s-1", "s-2", "s-3"]) == {"s-3"}
        many = [f"m-{n}" for n in range(2500)]  # past old SQLite's 999 parameters
        await store.set_interrupt("m-2499", "late")
        assert await store.pending_interrupts(many) == {"m-2499"}

    async def test_subsession_refs(self, store: Store) -> None:
        remote = SubSessionRef(
            parent_session_id="p",
            child_session_id="c-remote",
            agent_type="summarizer",
            tool_call_id="call-1",
            address="summarizer:50051",
            started_at=1_700_000_000.5,
            completed_at=None,
            remote=RemoteCursor(stream_id="remote-42", last_sequence=17),
        )
        local = SubSessionRef(
            parent_session_id="p",
            child_session_id="c-local",
            agent_type="critic",
            tool_call_id="call-2",
            status=SessionStatus.FAILED,
            started_at=1_700_000_001.0,
            completed_at=1_700_000_002.25,
            output_json='{"x": 1}',
            error="boom",
            failure_reason="max_steps",
        )
        third = SubSessionRef(
            parent_session_id="p", child_session_id="c-3", agent_type="a", tool_call_id="call-3"
        )
        other = SubSessionRef(
            parent_session_id="q", child_session_id="c-q", agent_type="a", tool_call_id="call-q"
        )
        for ref in (remote, local, third, other):
            await store.put_subsession_ref(ref)
        assert await store.list_subsession_refs("p") == [remote, local, third]
        finished = SubSessionRef(
            parent_session_id="p",
            child_session_id="c-remote",
            agent_type="summarizer",
            tool_call_id="call-1",
            status=SessionStatus.COMPLETED,
            address="summarizer:50051",
            started_at=1_700_000_000.5,
            completed_at=1_700_000_010.0,
            remote=RemoteCursor(stream_id="remote-42", last_sequence=30),
            output_json='{"summary": "ok"}',
        )
        await store.put_subsession_ref(finished)
        assert await store.list_subsession_refs("p") == [finished, local, third]
        assert await store.list_subsession_refs("q") == [other]
        assert await store.list_subsession_refs("nobody") == []
        assert await store.get_subsession_ref("p", "c-remote") == finished
        assert await store.get_subsession_ref("p", "c-local") == local
        assert await store.get_subsession_ref("q", "c-q") == other
        assert await store.get_subsession_ref("q", "c-remote") is None  # another parent's child
        assert await store.get_subsession_ref("nobody", "c-remote") is None

    # --- the outbox of child commands -------------------------------------------

    async def test_a_repeated_command_keeps_its_first_created_at(self, store: Store) -> None:
        first = make_command("p", "c", created_at=100.25, reason="user pressed stop")
        await store.put_commands([first])
        await store.record_attempt(first)
        again = make_command(
            "p", "c", address="moved:50051", created_at=200.5, reason="parent interrupted"
        )
        await store.put_commands([again])
        # One row: its first time and attempts, the latest address and reason.
        kept = dataclasses.replace(again, created_at=100.25, attempts=1)
        assert await store.list_commands() == [kept]
        # A key twice in one batch: as if put one after the other.
        await store.put_commands(
            [
                make_command("p", "c-2", created_at=300.0, reason="first"),
                make_command("p", "c-2", address="other:1", created_at=50.0, reason="second"),
            ]
        )
        second = make_command("p", "c-2", address="other:1", created_at=300.0, reason="second")
        assert await store.list_commands() == [kept, second]
        await store.put_commands([])  # nothing to do
        assert await store.list_commands() == [kept, second]

    async def test_concurrent_puts_of_one_command_store_one(self, store: Store) -> None:
        commands = [make_command("p", "c", created_at=1000.0 + n, reason=f"{n}") for n in range(20)]
        await asyncio.gather(*(store.put_commands([command]) for command in commands))
        (stored,) = await store.list_commands()
        assert stored.key == ("p", "c", "interrupt") and stored.attempts == 0
        assert stored.created_at in {command.created_at for command in commands}

    async def test_commands_are_listed_oldest_first_up_to_limit(self, store: Store) -> None:
        # Equal times order by ids, compared by code point ("B" < "a" < "a-b" < "é"),
        # and ids that a plain ':' join would run together stay apart.
        expected = [
            make_command("p", "old", created_at=1.0),
            make_command("B", "c", created_at=5.0),
            make_command("a", "b:c", created_at=5.0),
            make_command("a", "c", created_at=5.0),
            make_command("a-b", "c", created_at=5.0),
            make_command("a:b", "c", created_at=5.0),
            make_command("é", "c", created_at=5.0),
            make_command("p", "new", created_at=9.5, attempts=3),
        ]
        await store.put_commands(expected[4:])
        await store.put_commands(expected[:4][::-1])
        assert await store.list_commands() == expected
        assert await store.list_commands(limit=3) == expected[:3]
        assert await store.list_commands(limit=0) == []
        assert await store.list_commands(limit=-1) == []
        many = [make_command("q", f"c-{n:03}", created_at=10.0 + n) for n in range(120)]
        await store.put_commands(many)
        listed = await store.list_commands()  # 100 by default
        assert listed == (expected + many)[:100]

    async def test_failed_attempts_are_counted(self, store: Store) -> None:
        command = make_command("p", "c")
        await store.put_commands([command, make_command("p", "other")])
        await asyncio.gather(*(store.record_attempt(command) for _ in range(10)))
        stale = dataclasses.replace(command, attempts=0)  # an old copy counts on the stored one
        await store.record_attempt(stale)
        counts = {c.child_session_id: c.attempts for c in await store.list_commands()}
        assert counts == {"c": 11, "other": 0}
        await store.delete_command(command)
        await store.record_attempt(command)  # gone: nothing comes back
        assert [c.child_session_id for c in await store.list_commands()] == ["other"]
        await store.put_commands([command])  # ordered again: a new command, counted anew
        counts = {c.child_session_id: c.attempts for c in await store.list_commands()}
        assert counts == {"c": 0, "other": 0}

    async def test_delete_command_is_idempotent_and_drops_only_its_key(self, store: Store) -> None:
        mine = make_command("p-1", "c-1", created_at=1.0)
        kept = [
            make_command("p-1", "c-2", created_at=2.0),  # a sibling
            make_command("p-2", "c-1", created_at=3.0),  # another parent's child of that id
            make_command("p-3", "c-9", created_at=4.0),
        ]
        await store.put_commands([mine, *kept])
        await store.delete_command(mine)
        assert await store.list_commands() == kept
        await store.delete_command(mine)
        await store.delete_command(make_command("nobody", "nothing"))
        assert await store.list_commands() == kept
        await store.put_commands([mine])  # delivered once, ordered again: a new command
        assert await store.list_commands() == [mine, *kept]

    async def test_a_command_refuses_fields_no_store_can_key_by(self, store: Store) -> None:
        for name, value in (
            ("parent_session_id", ""),
            ("child_session_id", "c\x00"),
            ("address", "host:\ud800"),
            ("kind", "pause"),
            ("created_at", float("nan")),
            ("attempts", -1),
            ("attempts", 2**63),
        ):
            with pytest.raises(UsageError, match=f"ChildCommand.{name}"):
                make_command("p", "c", **{name: value})
        # The reason is free text: stored as every backend can hold it.
        odd = make_command("p", "c", reason="bad\x00byte, lone \ud800")
        assert odd.reason == "bad\ufffdbyte, lone \ufffd"
        await store.put_commands([odd])
        assert await store.list_commands() == [odd]
        largest = make_command("p", "c-2", created_at=odd.created_at + 1, attempts=2**63 - 1)
        await store.put_commands([largest])
        assert await store.list_commands() == [odd, largest]

    # --- leases and lifecycle -----------------------------------------------------

    async def test_renew_leases_takes_or_renews_each_in_one_call(self, store: Store) -> None:
        for session_id in ("r-1", "r-2", "r-3", "r-4"):
            await store.create_session(make_record(session_id))
        assert await store.acquire_lease("r-2", "B", ttl_s=30)  # live, elsewhere
        assert await store.acquire_lease("r-3", "B", ttl_s=0.2)  # lapses below
        assert await store.acquire_lease("r-4", "A", ttl_s=0.4)  # A's own
        await asyncio.sleep(0.3)
        ids = ["r-1", "r-2", "r-3", "r-4", "r-missing", "r-1"]
        assert await store.renew_leases(ids, "A", ttl_s=30) == {"r-1", "r-3", "r-4"}
        for session_id in ("r-1", "r-3", "r-4"):
            record = await store.get_session(session_id)
            assert record is not None and record.owner == "A"
            assert record.lease_expires_at > time.time() + 20
        still = await store.get_session("r-2")
        assert still is not None and still.owner == "B"
        assert await store.get_session("r-missing") is None  # not created by renewing
        assert await store.renew_leases(["r-2"], "A", ttl_s=30) == set()
        assert await store.renew_leases([], "A", ttl_s=30) == set()

    async def test_leases(self, store: Store) -> None:
        await store.create_session(make_record())
        assert await store.acquire_lease("s-1", "A", ttl_s=0.4) is True
        held = await store.get_session("s-1")
        assert held is not None and held.owner == "A"
        assert held.lease_expires_at > time.time()
        assert await store.acquire_lease("s-1", "B", ttl_s=0.4) is False
        await asyncio.sleep(0.25)
        assert await store.acquire_lease("s-1", "A", ttl_s=0.4) is True  # renew
        renewed = await store.get_session("s-1")
        assert renewed is not None and renewed.lease_expires_at > held.lease_expires_at
        await asyncio.sleep(0.25)  # past the first expiry, inside the renewed one
        assert await store.acquire_lease("s-1", "B", ttl_s=0.4) is False
        await asyncio.sleep(0.3)  # the renewed lease has lapsed too
        assert await store.acquire_lease("s-1", "B", ttl_s=30) is True
        assert await store.acquire_lease("s-1", "A", ttl_s=30) is False
        await store.release_lease("s-1", "A")  # not the owner: nothing happens
        still_b = await store.get_session("s-1")
        assert still_b is not None and still_b.owner == "B"
        await store.release_lease("s-1", "B")
        released = await store.get_session("s-1")
        assert released is not None and released.owner == ""
        assert await store.acquire_lease("s-1", "A", ttl_s=30) is True

    async def test_a_session_created_leased_is_held_until_its_lease_lapses(
        self, store: Store
    ) -> None:
        # The record's own lease_expires_at is ignored: the TTL counts from the store's clock.
        record = make_record(owner="A", lease_expires_at=1.0)
        stored, created = await store.create_session(record, lease_ttl_s=0.4)
        assert created is True and stored.owner == "A"
        assert time.time() < stored.lease_expires_at <= time.time() + 5
        assert await store.get_session("s-1") == stored
        assert await store.acquire_lease("s-1", "B", ttl_s=30) is False
        assert await store.acquire_lease("s-1", "A", ttl_s=0.4) is True  # its owner renews
        await asyncio.sleep(0.6)
        assert await store.acquire_lease("s-1", "B", ttl_s=30) is True  # lapsed: taken over
        # An existing session comes back untouched: no lease taken, none changed.
        again, created = await store.create_session(
            make_record(owner="C", input_json='{"a": 2}'), lease_ttl_s=30
        )
        assert created is False and again.owner == "B"
        with pytest.raises(UsageError):
            await store.create_session(make_record("s-2"), lease_ttl_s=30)  # no owner
        with pytest.raises(UsageError):
            await store.create_session(make_record("s-2", owner="A"), lease_ttl_s=0)
        assert await store.get_session("s-2") is None

    async def test_aclose_is_idempotent(self, store: Store) -> None:
        await store.aclose()
        await store.aclose()


class DurableStoreConformance(StoreConformance):
    """The suite plus what only a store whose data outlives its object can show."""

    async def test_data_survives_a_new_instance(self, store: Store, reopen: Reopen) -> None:
        checkpoint = Checkpoint(
            session_id="s-1", step=1, messages=[{"role": "user"}], last_sequence=2
        )
        ref = SubSessionRef(
            parent_session_id="s-1",
            child_session_id="c-1",
            agent_type="critic",
            tool_call_id="call-1",
            remote=RemoteCursor(stream_id="r-1", last_sequence=4),
        )
        await store.create_session(make_record(metadata={"k": "v"}))
        await store.append(
            "s-1",
            [make_event("a"), make_event("b")],
            expected_sequence=0,
            update=SessionUpdate(status=SessionStatus.COMPLETED),
        )
        await store.save_checkpoint(checkpoint)
        await store.set_interrupt("s-1", "stop")
        await store.put_subsession_ref(ref)
        assert await store.acquire_lease("s-1", "A", ttl_s=60)
        stored = await store.get_session("s-1")
        await store.aclose()

        second = await reopen()
        try:
            assert await second.get_session("s-1") == stored
            assert stored is not None and stored.status is SessionStatus.COMPLETED
            log = await second.read("s-1")
            assert [(e.sequence, e.text_delta.text) for e in log] == [(1, "a"), (2, "b")]
            assert await second.load_checkpoint("s-1") == checkpoint
            assert await second.take_interrupt("s-1") == "stop"
            assert await second.list_subsession_refs("s-1") == [ref]
            assert await second.list_sessions(status=SessionStatus.COMPLETED) == [stored]
            assert await second.acquire_lease("s-1", "B", ttl_s=60) is False
            assert await second.append("s-1", [make_event("c")], expected_sequence=2) == 3
        finally:
            await second.aclose()

    async def test_two_instances_share_one_log(self, store: Store, reopen: Reopen) -> None:
        # Two instances stand in for two processes: separate connections, one log.
        other = await reopen()
        try:
            await store.create_session(make_record())

            async def writer(target: Store, name: str) -> None:
                end = 0
                for i in range(25):
                    end = await _append_racing(target, "s-1", make_event(f"{name}-{i}"), end=end)

            await asyncio.gather(writer(store, "x"), writer(other, "y"))
            log = await other.read("s-1")
            assert [e.sequence for e in log] == list(range(1, 51))
            assert len({e.text_delta.text for e in log}) == 50
        finally:
            await other.aclose()

    async def test_commands_survive_a_new_instance(self, store: Store, reopen: Reopen) -> None:
        # The outbox outlives the parent's process, and any replica can deliver it.
        first = make_command("p-1", "c-1", created_at=1_700_000_000.125, reason="stop")
        second = make_command("p-2", "c-1", address="critic:50051", created_at=1_700_000_001.5)
        await store.put_commands([first, second])
        await store.record_attempt(first)
        await store.aclose()
        replica = await reopen()
        try:
            counted = dataclasses.replace(first, attempts=1)
            assert await replica.list_commands() == [counted, second]
            await replica.delete_command(counted)
            await replica.record_attempt(second)
        finally:
            await replica.aclose()
        again = await reopen()
        try:
            assert await again.list_commands() == [dataclasses.replace(second, attempts=1)]
        finally:
            await again.aclose()
