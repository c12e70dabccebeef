"""The store suite: the event log."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import (
    READ_LIMIT,
    CheckpointStore,
    ChildRefStore,
    EncodedEventReader,
    EventLogStore,
    InterruptStore,
    LeaseStore,
    OutboxStore,
    SessionStore,
    SessionUpdate,
    Store,
    SubSessionRef,
)
from helix_transport.testing.store_suite._helpers import (
    append_racing,
    make_event,
    make_record,
    sequences,
    texts,
)


class EventLogConformance:
    """The event log: fenced appends and reads."""

    pytestmark = pytest.mark.asyncio

    async def test_append_assigns_gapless_sequences(self, store: Store) -> None:
        await store.create_session(make_record())
        first = [make_event(t) for t in "abc"]
        assert await store.append("s-1", first, expected_sequence=0) == 3
        assert sequences(first) == [1, 2, 3]
        second = [make_event(t) for t in "de"]
        assert await store.append("s-1", second, expected_sequence=3) == 5
        assert sequences(second) == [4, 5]
        log = await store.read("s-1")
        assert sequences(log) == [1, 2, 3, 4, 5]
        assert texts(log) == list("abcde")
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
                end = await append_racing(store, "s-1", event, end=end)
                assert end == event.sequence
                assigned[event.sequence] = event.text_delta.text

        await asyncio.gather(*(writer(w) for w in range(10)))
        log = await store.read("s-1")
        assert sequences(log) == list(range(1, 201))
        assert {e.sequence: e.text_delta.text for e in log} == assigned
        assert sorted(texts(log)) == sorted(f"w{w}-{i}" for w in range(10) for i in range(20))
        for w in range(10):  # each writer's own events stay in its order
            mine = [t for t in texts(log) if t.startswith(f"w{w}-")]
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
        assert sequences(stale) == [0, 0]
        assert texts(await store.read("s-1")) == ["a"]
        assert texts(await store.read("s-2")) == ["x"]
        assert texts(await store.read("s-3")) == ["y", "z"]
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
        assert texts(await store.read("s-1")) == ["a"]
        assert texts(await store.read("s-3")) == ["c"]
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
        assert sequences(seen) == [1, 2, 3, 4, 5, 6]
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
        assert sequences(events) == [2, 3]
        read = await store.read("s-1")
        assert [e.SerializeToString() for e in read[1:]] == encoded
        assert texts(read) == ["a", "b", "c"]
        record = await store.get_session("s-1")
        assert record is not None and (record.last_sequence, record.step_count) == (3, 1)
        stale = [make_event("stale")]
        stale[0].sequence = 3
        with pytest.raises(SequenceConflict):
            await store.append(
                "s-1", stale, expected_sequence=2, encoded=[stale[0].SerializeToString()]
            )
        assert texts(await store.read("s-1")) == ["a", "b", "c"]

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
        assert texts(await store.read("s-1")) == ["a", "b"]

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
        assert texts(await store.read("s-1")) == ["a", "b"]
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
        assert texts(await store.read("s-1")) == ["original"]

    async def test_read_ranges_and_limits(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append("s-1", [make_event(f"e{n}") for n in range(1, 6)], expected_sequence=0)
        everything = await store.read("s-1", from_sequence=0)
        assert sequences(everything) == [1, 2, 3, 4, 5]
        assert texts(everything) == ["e1", "e2", "e3", "e4", "e5"]
        assert all(e.session_id == "s-1" and e.step == 1 for e in everything)
        middle = await store.read("s-1", from_sequence=2)
        assert (sequences(middle), texts(middle)) == ([3, 4, 5], ["e3", "e4", "e5"])
        assert await store.read("s-1", from_sequence=5) == []
        assert await store.read("s-1", from_sequence=99) == []
        assert sequences(await store.read("s-1", from_sequence=1, limit=2)) == [2, 3]
        assert sequences(await store.read("s-1", limit=1)) == [1]

    async def test_read_returns_at_most_read_limit(self, store: Store) -> None:
        await store.create_session(make_record())
        await store.append(
            "s-1", [make_event(str(n)) for n in range(READ_LIMIT + 5)], expected_sequence=0
        )
        page = await store.read("s-1", limit=READ_LIMIT * 2)
        assert sequences(page) == list(range(1, READ_LIMIT + 1))
        rest = await store.read("s-1", from_sequence=READ_LIMIT)
        assert sequences(rest) == list(range(READ_LIMIT + 1, READ_LIMIT + 6))

    async def test_read_encoded_is_read_serialized(self, store: Store) -> None:
        # Optional role: a replay sends these bytes as they are, so they must be what
        # ``read`` gives, serialized: every sequence in place, the same pages and cuts.
        if not isinstance(store, EncodedEventReader):
            pytest.skip("the store does not hand out encoded pages")
        assert await store.read_encoded("nobody") == []
        await store.create_session(make_record())
        await store.append("s-1", [make_event(f"e{n}") for n in range(1, 4)], expected_sequence=0)
        given = [make_event(text) for text in ("f", "\u00a2\x01 g")]  # a terminal key's bytes
        for sequence, event in enumerate(given, start=4):
            event.sequence = sequence
        data = [event.SerializeToString() for event in given]
        await store.append("s-1", (), expected_sequence=3, encoded=data)
        for i in range(2):
            big = [make_event(f"{i}" * (3 << 20))]
            await store.append("s-1", big, expected_sequence=5 + i)
        for after, limit in ((0, READ_LIMIT), (0, 2), (2, 3), (4, READ_LIMIT), (5, 1), (7, 5)):
            read = await store.read("s-1", from_sequence=after, limit=limit)
            encoded = await store.read_encoded("s-1", from_sequence=after, limit=limit)
            assert encoded == [event.SerializeToString() for event in read], (after, limit)
        assert (await store.read_encoded("s-1", from_sequence=3, limit=2)) == data
