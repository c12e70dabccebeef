"""``EventHub``: the in-memory tail readers are served from before they touch the store."""

from __future__ import annotations

from helix_transport._eventlog import EventHub
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


def _events(first: int, count: int, *, text: str = "x" * 90) -> list[pb.StreamEvent]:
    return [
        pb.StreamEvent(sequence=s, text_delta=pb.TextDelta(text=text))
        for s in range(first, first + count)
    ]


async def test_a_reader_behind_by_less_than_the_tail_is_served_from_memory() -> None:
    hub = EventHub()  # more than the 1,024 events it used to keep, whatever their size
    hub.publish("s", _events(1, 4_000, text="x"))
    cached = hub.since("s", 1_000, limit=10_000)
    assert cached is not None and [e.sequence for e in cached] == list(range(1_001, 4_001))


async def test_the_tail_keeps_the_newest_events_within_its_byte_budget() -> None:
    size = _events(1, 1)[0].ByteSize()
    hub = EventHub(tail_bytes=size * 10)
    for first in range(1, 99, 7):  # 14 publishes, as a writer's batches
        hub.publish("s", _events(first, 7))
    newest = 98
    assert hub.since("s", newest - 11, limit=100) is None  # that far back is gone
    cached = hub.since("s", newest - 10, limit=100)
    assert cached is not None and [e.sequence for e in cached] == list(
        range(newest - 9, newest + 1)
    )


async def test_an_event_larger_than_the_budget_is_still_cached_alone() -> None:
    hub = EventHub(tail_bytes=1_000)
    hub.publish("s", _events(1, 3))
    hub.publish("s", _events(4, 1, text="y" * 50_000))
    assert hub.since("s", 3, limit=10) == _events(4, 1, text="y" * 50_000)
    assert hub.since("s", 2, limit=10) is None


async def test_the_tail_is_also_bounded_in_events() -> None:
    hub = EventHub(tail_size=100)
    hub.publish("s", _events(1, 250, text=""))
    assert hub.since("s", 149, limit=1_000) is None
    cached = hub.since("s", 150, limit=1_000)
    assert cached is not None and len(cached) == 100


async def test_a_publish_that_does_not_follow_the_tail_replaces_it() -> None:
    hub = EventHub()
    hub.publish("s", _events(1, 10))
    hub.publish("s", _events(50, 5))  # another writer took the session over
    assert hub.since("s", 10, limit=100) is None
    cached = hub.since("s", 49, limit=100)
    assert cached is not None and [e.sequence for e in cached] == [50, 51, 52, 53, 54]


def _terminal(sequence: int) -> pb.StreamEvent:
    return pb.StreamEvent(sequence=sequence, completed=pb.Completed(output_json="{}"))


async def test_readers_woken_by_the_end_read_it_from_memory_then_the_tail_goes() -> None:
    hub = EventHub()
    with hub.reading("s"):
        hub.publish("s", _events(1, 3))
        hub.publish("s", [_terminal(4)])
        hub.forget("s")  # the run's writer stops right after its terminal event
        cached = hub.since("s", 3, limit=10)
        assert cached is not None and [e.sequence for e in cached] == [4]
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
