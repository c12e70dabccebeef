"""``EventHub``: the in-memory tail readers are served from before they touch the store."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import StoreUnavailable
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.log import Batch, EventHub, SessionWriter, follow
from helix_transport.store import READ_LIMIT, Checkpoint, SessionRecord, SessionUpdate
from helix_transport.store.memory import MemoryStore


def _events(first: int, count: int, *, text: str = "x" * 90) -> list[pb.StreamEvent]:
    return [
        pb.StreamEvent(sequence=s, text_delta=pb.TextDelta(text=text))
        for s in range(first, first + count)
    ]


async def test_a_reader_behind_by_less_than_the_tail_is_served_from_memory() -> None:
    hub = EventHub()  # more than the 1,024 events it used to keep, whatever their size
    published = _events(1, 4_000, text="x")
    hub.publish("s", published)
    cached = hub.since("s", 1_000, limit=10_000)
    assert cached is not None and [e.sequence for e in cached.decode()] == list(range(1_001, 4_001))
    assert cached.encoded == [e.SerializeToString() for e in published[1_000:]]
    assert (cached.last_sequence, cached.terminal) == (4_000, False)


async def test_the_tail_keeps_the_newest_events_within_its_byte_budget() -> None:
    size = _events(1, 1)[0].ByteSize()
    hub = EventHub(tail_bytes=size * 10)
    for first in range(1, 99, 7):  # 14 publishes, as a writer's batches
        hub.publish("s", _events(first, 7))
    newest = 98
    assert hub.since("s", newest - 11, limit=100) is None  # that far back is gone
    cached = hub.since("s", newest - 10, limit=100)
    assert cached is not None and [e.sequence for e in cached.decode()] == list(
        range(newest - 9, newest + 1)
    )


async def test_an_event_larger_than_the_budget_is_still_cached_alone() -> None:
    hub = EventHub(tail_bytes=1_000)
    hub.publish("s", _events(1, 3))
    hub.publish("s", _events(4, 1, text="y" * 50_000))
    cached = hub.since("s", 3, limit=10)
    assert cached is not None and cached.decode() == _events(4, 1, text="y" * 50_000)
    assert hub.since("s", 2, limit=10) is None


async def test_the_tail_is_also_bounded_in_events() -> None:
    hub = EventHub(tail_size=100)
    hub.publish("s", _events(1, 250, text=""))
    assert hub.since("s", 149, limit=1_000) is None
    cached = hub.since("s", 150, limit=1_000)
    assert cached is not None and len(cached.decode()) == 100


async def test_a_publish_that_does_not_follow_the_tail_replaces_it() -> None:
    hub = EventHub()
    hub.publish("s", _events(1, 10))
    hub.publish("s", _events(50, 5))  # another writer took the session over
    assert hub.since("s", 10, limit=100) is None
    cached = hub.since("s", 49, limit=100)
    assert cached is not None and [e.sequence for e in cached.decode()] == [50, 51, 52, 53, 54]


def _terminal(sequence: int) -> pb.StreamEvent:
    return pb.StreamEvent(sequence=sequence, completed=pb.Completed(output_json="{}"))


async def test_readers_woken_by_the_end_read_it_from_memory_then_the_tail_goes() -> None:
    hub = EventHub()
    with hub.reading("s"):
        hub.publish("s", _events(1, 3))
        hub.publish("s", [_terminal(4)])
        hub.forget("s")  # the run's writer stops right after its terminal event
        cached = hub.since("s", 3, limit=10)
        assert cached is not None and [e.sequence for e in cached.decode()] == [4]
    assert hub.tails() == 0  # the last reader out dropped it


async def test_an_end_nobody_reads_drops_the_tail_at_once() -> None:
    hub = EventHub()
    hub.publish("s", [*_events(1, 3), _terminal(4)])
    assert hub.tails() == 0 and hub.since("s", 3, limit=10) is None


async def test_a_writer_that_stops_without_an_end_drops_the_tail_even_with_readers() -> None:
    hub = EventHub()
    with hub.reading("s"):
        hub.publish("s", _events(1, 3))
        waiter = hub.waiter("s")
        hub.forget("s")  # e.g. it lost its lease: readers must go back to the store
        assert waiter.done() and hub.since("s", 1, limit=10) is None


async def test_a_reader_already_past_the_end_is_sent_to_the_store_not_left_waiting() -> None:
    hub = EventHub()
    with hub.reading("s"):  # another reader still draining keeps the ended tail
        hub.publish("s", [*_events(1, 3), _terminal(4)])
        assert hub.since("s", 2, limit=10) is not None
        assert hub.since("s", 4, limit=10) is None  # not [], which would mean "wait"
        partial = hub.since("s", 1, limit=2)
        assert partial is not None and (partial.last_sequence, partial.terminal) == (3, False)
        rest = hub.since("s", 3, limit=10)
        assert rest is not None and (rest.last_sequence, rest.terminal) == (4, True)


async def test_a_reader_of_an_ended_turn_stops_at_its_end_while_the_next_turn_is_cached() -> None:
    hub = EventHub()
    with hub.reading("s"):  # a reader still draining turn 1 keeps its tail
        hub.publish("s", [*_events(1, 3), _terminal(4)])
        hub.publish("s", _events(5, 3))  # Continue: turn 2 goes on in the same tail
        turn_1 = hub.since("s", 0, limit=10)
        assert turn_1 is not None and (turn_1.last_sequence, turn_1.terminal) == (4, True)
        assert [e.sequence for e in turn_1.decode()] == [1, 2, 3, 4]
        turn_2 = hub.since("s", 4, limit=10)
        assert turn_2 is not None and (turn_2.last_sequence, turn_2.terminal) == (7, False)


async def test_a_replay_from_the_store_stops_at_the_first_end_after_it() -> None:
    store = MemoryStore()
    await store.create_session(
        SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="h")
    )
    # Two turns (a continued session), each ending in its own terminal event.
    await store.append(
        "s", [*_events(1, 3), _terminal(4), *_events(5, 2), _terminal(7)], expected_sequence=0
    )
    hub = EventHub()
    turn_1 = [b async for b in follow(store, hub, "s", from_sequence=0)]
    turn_2 = [b async for b in follow(store, hub, "s", from_sequence=4)]
    assert [e.sequence for b in turn_1 for e in b.decode()] == [1, 2, 3, 4]
    assert [e.sequence for b in turn_2 for e in b.decode()] == [5, 6, 7]


async def test_the_tail_keeps_bytes_not_message_objects() -> None:
    # Message objects are tracked by the garbage collector: hundreds of sessions' tails
    # of them made every full collection traverse them all.
    def messages() -> int:
        gc.collect()
        return sum(isinstance(o, pb.StreamEvent) for o in gc.get_objects())

    hub = EventHub()
    before = messages()
    hub.publish("s", _events(1, 1_000))
    assert messages() == before
    cached = hub.since("s", 0, limit=1_000)
    assert cached is not None and len(cached.encoded) == 1_000


async def test_events_a_local_reader_still_needs_outlive_the_tail_bound() -> None:
    hub = EventHub(tail_size=100, reader_tail_size=1_000)
    with hub.reading("s") as reader:
        hub.publish("s", _events(1, 500, text=""))  # a burst the reader has not seen
        cached = hub.since("s", 0, limit=1_000)
        assert cached is not None and len(cached.decode()) == 500
        reader.last_sequence = 400  # what follow() records as it hands out events
        hub.publish("s", _events(501, 10, text=""))
        assert hub.since("s", 399, limit=1_000) is None  # what every reader has goes
        cached = hub.since("s", 400, limit=1_000)
        assert cached is not None and [e.sequence for e in cached.decode()] == list(range(401, 511))
    hub.publish("s", _events(511, 1, text=""))  # no reader left: back to the tail bound
    cached = hub.since("s", 411, limit=1_000)
    assert hub.since("s", 410, limit=1_000) is None
    assert cached is not None and len(cached.decode()) == 100


async def test_a_slow_reader_cannot_hold_more_than_the_reader_bound() -> None:
    size = _events(1, 1)[0].ByteSize()
    hub = EventHub(tail_size=10, tail_bytes=size * 10, reader_tail_bytes=size * 50)
    with hub.reading("s"):
        hub.publish("s", _events(1, 200))
        assert hub.since("s", 150, limit=1_000) is None
        cached = hub.since("s", 151, limit=1_000)
        assert cached is not None and len(cached.decode()) == 49


async def test_a_reader_behind_a_burst_is_served_from_memory_not_the_store() -> None:
    """A parent forwarding a child's burst: the writer appends faster than its reader
    drains; the reader's cursor keeps what it is owed in memory, past the tail bound."""
    store = _CountingReads()
    hub = EventHub(tail_size=10, reader_tail_size=10_000)
    writer = await _new_session(store, hub)
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="first")))
    await writer.flush()
    seen: list[int] = []

    async def read() -> None:
        async for batch in follow(store, hub, "s", from_sequence=0, batch_limit=100):
            seen.extend(e.sequence for e in batch.decode())
            await asyncio.sleep(0)  # slower than the writer

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    reads_before_the_burst = store.reads
    for _ in range(20):
        for _ in range(100):
            writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="x")))
        await writer.flush()
    await writer.finish(_terminal(0), SessionUpdate(status=SessionStatus.COMPLETED))
    await asyncio.wait_for(reader, 5)
    assert seen == list(range(1, 2_003))
    assert store.reads == reads_before_the_burst  # every burst event came from the hub


async def _new_session(store: MemoryStore, hub: EventHub) -> SessionWriter:
    """Session ``s`` in ``store``, and its writer."""
    await store.create_session(
        SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="")
    )
    return SessionWriter(store, hub, session_id="s", agent_type="a", last_sequence=0)


class _CountingReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[pb.StreamEvent]:
        self.reads += 1
        return await super().read(session_id, from_sequence=from_sequence, limit=limit)

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        self.reads += 1  # how ``follow`` reads the memory store
        return await super().read_encoded(session_id, from_sequence=from_sequence, limit=limit)


async def test_the_writer_serializes_each_event_once_for_store_hub_and_readers() -> None:
    store = _RecordingAppends()
    hub = EventHub()
    writer = await _new_session(store, hub)
    for text in ("a", "b", "c"):
        writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text=text)))
    await writer.flush()
    stored = await store.read("s")
    [given] = store.encoded
    assert given == [e.SerializeToString() for e in stored]  # sequences included
    cached = hub.since("s", 0, limit=10)
    assert cached is not None and cached.encoded == given
    assert [e.sequence for e in cached.decode()] == [1, 2, 3]


class _RecordingAppends(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[list[bytes]] = []

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        self.encoded.append(list(options.get("encoded") or []))
        return await super().append(session_id, events, **options)


async def test_events_emitted_encoded_are_stamped_and_stored_as_given() -> None:
    store = _RecordingAppends()
    hub = EventHub()
    writer = await _new_session(store, hub)
    writer.step = 3
    writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))
    child = pb.StreamEvent(sequence=9, text_delta=pb.TextDelta(text="from the child"))
    payload = pb.StreamEvent(
        child_event=pb.ChildEvent(tool_call_id="call_1", event=child)
    ).SerializeToString()
    writer.emit_encoded([payload, payload])
    await writer.flush()
    stored = await store.read("s")
    assert [e.sequence for e in stored] == [1, 2, 3]
    assert all((e.session_id, e.agent_type, e.step) == ("s", "a", 3) for e in stored)
    assert stored[1].time == stored[2].time and stored[1].time.seconds > 0
    assert stored[2].child_event.event == child
    assert store.encoded == [[e.SerializeToString() for e in stored]]  # byte for byte


class _RecordingCheckpoints(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        self.calls.append("append+checkpoint" if options.get("checkpoint") else "append")
        return await super().append(session_id, events, **options)

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.calls.append("save_checkpoint")
        await super().save_checkpoint(checkpoint)


async def test_a_checkpoint_rides_with_the_pending_events() -> None:
    store = _RecordingCheckpoints()
    writer = await _new_session(store, EventHub())
    step = Checkpoint(session_id="s", step=1, messages=[{"role": "user", "content": "x"}])
    writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="y")))
    await writer.flush(SessionUpdate(step_count=1), checkpoint=step)
    assert store.calls == ["append+checkpoint"]  # one write, not three
    assert await store.load_checkpoint("s") == dataclasses.replace(step, last_sequence=2)
    record = await store.get_session("s")
    assert record is not None and record.step_count == 1
    # Nothing pending: an append of no events carries the update and the checkpoint.
    store.calls.clear()
    await writer.flush(SessionUpdate(step_count=2), checkpoint=dataclasses.replace(step, step=2))
    assert store.calls == ["append+checkpoint"]
    saved = await store.load_checkpoint("s")
    assert saved is not None and (saved.step, saved.last_sequence) == (2, 2)
    record = await store.get_session("s")
    assert record is not None and (record.step_count, record.last_sequence) == (2, 2)


async def test_deferred_events_wait_for_the_next_write_and_go_in_it() -> None:
    store = _RecordingAppends()
    writer = await _new_session(store, EventHub())
    writer.emit(pb.StreamEvent(tool_start=pb.ToolStart(tool_name="__finish__")), defer=True)
    writer.emit(pb.StreamEvent(output=pb.Output(output_json="{}")), defer=True)
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.encoded == []  # nothing started a write
    await writer.finish(
        pb.StreamEvent(completed=pb.Completed(output_json="{}")),
        SessionUpdate(status=SessionStatus.COMPLETED),
    )
    assert [len(batch) for batch in store.encoded] == [3]  # one write for all three
    record = await store.get_session("s")
    assert record is not None and record.status is SessionStatus.COMPLETED
    # A plain flush writes deferred events too: flush means "all emitted is durable".
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="late")), defer=True)
    await writer.flush()
    assert [len(batch) for batch in store.encoded] == [3, 1]


async def test_a_reader_caught_up_with_a_starting_writer_waits_instead_of_reading_the_store() -> (
    None
):
    store = _CountingReads()
    hub = EventHub()
    writer = await _new_session(store, hub)  # expects its first publish at sequence 1
    seen: list[int] = []

    async def read() -> None:
        async for batch in follow(store, hub, "s", from_sequence=0, poll_interval_s=30):
            seen.extend(e.sequence for e in batch.decode())

    reader = asyncio.create_task(read())
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.reads == 0
    writer.emit(pb.StreamEvent(run_started=pb.RunStarted()))
    await writer.finish(
        pb.StreamEvent(completed=pb.Completed()), SessionUpdate(status=SessionStatus.COMPLETED)
    )
    await asyncio.wait_for(reader, 5)
    assert seen == [1, 2] and store.reads == 0
    # A resumed writer starts past events only the store has: a reader from 0 reads them.
    hub.expect("t", 3)
    assert hub.since("t", 0, limit=10) is None
    assert hub.since("t", 2, limit=10) == Batch([])


def _trim_one_by_one(
    sizes: list[int], first: int, owed_after: int | None, bounds: tuple[int, int, int, int]
) -> int:
    """How many events the tail's rule drops, applied one event at a time."""
    size, nbytes, reader_size, reader_nbytes = bounds
    count, left, drop = len(sizes), sum(sizes), 0
    while drop < count - 1:
        if not (count - drop > size or left > nbytes):
            break
        owed = owed_after is not None and first + drop > owed_after
        if owed and not (count - drop > reader_size or left > reader_nbytes):
            break
        left -= sizes[drop]
        drop += 1
    return drop


async def test_the_tail_drops_what_the_one_by_one_rule_drops() -> None:
    import random

    from helix_transport.log.hub import Reader, _Tail

    rng = random.Random(9)
    for _ in range(3_000):
        size, nbytes = rng.randint(1, 40), rng.randint(1, 4_000)
        bounds = (size, nbytes, size + rng.randint(0, 40), nbytes + rng.randint(0, 4_000))
        hub = EventHub(
            tail_size=bounds[0],
            tail_bytes=bounds[1],
            reader_tail_size=bounds[2],
            reader_tail_bytes=bounds[3],
        )
        sizes = [rng.choice((1, 10, 100, 1_000)) for _ in range(rng.randint(1, 120))]
        first = rng.randint(1, 50)
        owed_after = rng.choice((None, rng.randint(first - 5, first + len(sizes) + 5)))
        readers: list[Reader] | None = None
        if owed_after is not None:
            readers = [Reader(last_sequence=owed_after + 3)] * 2
            readers.append(Reader(last_sequence=owed_after))  # the slowest one counts
        tail = _Tail(
            waiter=asyncio.get_running_loop().create_future(),
            encoded=[b"x" * n for n in sizes],
            first=first,
            nbytes=sum(sizes),
        )
        expected = _trim_one_by_one(sizes, first, owed_after, bounds)
        hub._trim(tail, readers)
        assert tail.first == first + expected, (sizes, first, owed_after, bounds)
        assert tail.encoded == [b"x" * n for n in sizes[expected:]]
        assert tail.nbytes == sum(sizes[expected:])


async def test_a_reader_leaving_removes_itself_not_an_equal_one() -> None:
    # Two readers at one sequence are still two readers: the one that leaves must not
    # take the other's entry with it (that reader's own exit then failed, and the
    # leaver's stale entry held the tail for nobody).
    hub = EventHub()
    hub.publish("s", _events(1, 10))
    with hub.reading("s", from_sequence=5) as staying:
        with hub.reading("s", from_sequence=0) as leaving:
            leaving.last_sequence = 5
        assert hub._readers["s"] == [staying] and hub._readers["s"][0] is staying
        staying.last_sequence = 9
    assert "s" not in hub._readers


class NoticesDown(MemoryStore):
    """A store whose cross-process notices fail (a lost LISTEN connection, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self, *args: Any, **kwargs: Any) -> list[pb.StreamEvent]:
        self.reads += 1
        return await super().read(*args, **kwargs)

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        raise StoreUnavailable("notices: down for the test")


async def test_a_follower_whose_store_cannot_notify_polls_instead_of_spinning() -> None:
    # Before, each failed wait returned at once and the follower read the store again
    # in a loop (3,346 reads in 2 s against PostgreSQL after its LISTEN connection died).
    store = NoticesDown()
    await store.create_session(
        SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="")
    )
    reader = asyncio.ensure_future(
        anext(aiter(follow(store, EventHub(), "s", from_sequence=0, poll_interval_s=0.2)))
    )
    await asyncio.sleep(1.0)
    assert not reader.done()
    reader.cancel()
    assert store.reads <= 10, store.reads  # about one per poll interval


class _SlowAppends(MemoryStore):
    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        await asyncio.sleep(0.1)
        return await super().append(session_id, events, **options)


async def test_a_write_landing_after_its_run_ended_leaves_no_tail_behind() -> None:
    # A run cancelled (its lease lost) while an append was in flight: the hub forgot the
    # session, then the append landed and published into a new tail nothing ever
    # dropped; readers past it waited a poll interval at every turn, for good.
    store = _SlowAppends()
    await store.create_session(
        SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="")
    )
    hub = EventHub()
    writer = SessionWriter(store, hub, session_id="s", agent_type="a", last_sequence=0)
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="late")))
    await asyncio.sleep(0.02)  # the append is in flight
    writer.close()
    hub.forget("s")
    await asyncio.sleep(0.2)
    assert [e.text_delta.text for e in await store.read("s")] == ["late"]
    assert hub.since("s", 0, 10) is None  # no tail: readers go to the store


async def test_an_event_with_its_own_step_keeps_it_and_is_logged_canonically() -> None:
    store = _RecordingAppends()
    writer = await _new_session(store, EventHub())
    writer.step = 3
    writer.emit(pb.StreamEvent(step=7, run_resumed=pb.RunResumed()))  # stamped as a message
    writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))  # its stamp's bytes before it
    writer.emit(pb.StreamEvent())  # nothing set at all
    await writer.flush()
    [given] = store.encoded
    stored = await store.read("s")
    assert given == [e.SerializeToString() for e in stored]
    assert [(e.sequence, e.step) for e in stored] == [(1, 7), (2, 3), (3, 3)]
    assert all((e.session_id, e.agent_type) == ("s", "a") and e.time.seconds for e in stored)


async def test_a_text_fragment_is_logged_as_emit_would_log_its_message() -> None:
    store = _RecordingAppends()
    hub = EventHub()
    writer = await _new_session(store, hub)
    fragments = ["a", "é" * 100, ""]  # a one-byte size, a two-byte one, an empty fragment
    for step, text in enumerate(fragments):
        writer.step = step  # 0: no step field, as emit leaves it
        writer.emit_text(text)
        writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text=text)))
    await writer.flush()
    [given] = store.encoded
    stored = await store.read("s")
    assert given == [e.SerializeToString() for e in stored]  # canonical, as emit's bytes are
    for fast, made in zip(stored[::2], stored[1::2], strict=True):
        assert fast.time.ToNanoseconds() <= made.time.ToNanoseconds()
        fast.ClearField("time")
        made.ClearField("time")
        assert made.sequence == fast.sequence + 1
        made.sequence = fast.sequence
        assert fast == made
    assert [e.step for e in stored[::2]] == [0, 1, 2]
    assert [e.text_delta.text for e in stored[::2]] == fragments


async def test_a_write_stamps_its_events_once_with_its_first_events_time() -> None:
    store = _RecordingAppends()
    writer = await _new_session(store, EventHub())
    before = time.time_ns()
    writer.step = 1
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="a")))
    writer.emit_text("b")
    writer.step = 2  # a new step: a new stamp, in the same write
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="c")))
    await writer.flush()
    await asyncio.sleep(0.002)
    writer.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="d")))  # the next write's own
    await writer.flush()
    stored = await store.read("s")
    assert store.encoded == [
        [e.SerializeToString() for e in stored[:3]],
        [stored[3].SerializeToString()],
    ]
    assert [(e.sequence, e.step, e.text_delta.text) for e in stored] == [
        (1, 1, "a"),
        (2, 1, "b"),
        (3, 2, "c"),
        (4, 2, "d"),
    ]
    times = [e.time.ToNanoseconds() for e in stored]
    assert before <= times[0] == times[1] <= times[2] < times[3] <= time.time_ns()
