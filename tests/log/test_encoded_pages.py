"""Replay as bytes: where a page's stream ends, found without parsing each event, and
pages read one ahead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from helix_transport._events import TERMINAL_KINDS
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.log import EventHub, follow
from helix_transport.log._encoded import first_terminal
from helix_transport.store import EncodedEventReader, SessionRecord
from helix_transport.store.memory import MemoryStore


def _delta(sequence: int, text: str = "x") -> pb.StreamEvent:
    return pb.StreamEvent(
        sequence=sequence, session_id="s", agent_type="a", text_delta=pb.TextDelta(text=text)
    )


def _end(sequence: int, kind: str) -> pb.StreamEvent:
    event = pb.StreamEvent(sequence=sequence, session_id="s", agent_type="a")
    getattr(event, kind).SetInParent()
    return event


def test_no_terminal_event_is_none_even_with_a_key_s_bytes_inside_a_field() -> None:
    # U+00A2 is c2 a2 in UTF-8: with \x01 after it, the bytes of ``completed``'s key.
    events = [_delta(n, "\u00a2\x01") for n in range(1, 50)]
    encoded = [event.SerializeToString() for event in events]
    assert any(b"\xa2\x01" in data for data in encoded)
    assert first_terminal(encoded) is None
    assert first_terminal([]) is None


@pytest.mark.parametrize("kind", sorted(TERMINAL_KINDS))
def test_the_first_terminal_event_is_found_among_candidates(kind: str) -> None:
    events = [_delta(1, "\u00a2\x01"), _delta(2), _end(3, kind), _delta(4), _end(5, kind)]
    encoded = [event.SerializeToString() for event in events]
    assert first_terminal(encoded) == 2
    assert first_terminal(encoded[3:]) == 1
    assert first_terminal(encoded[:2]) is None


async def _two_turns(store: MemoryStore, first: int, second: int) -> None:
    await store.create_session(
        SessionRecord(session_id="s", agent_type="a", input_json="{}", input_hash="h")
    )
    events = [
        *(_delta(n) for n in range(1, first)),
        _end(first, "completed"),
        *(_delta(n) for n in range(first + 1, second)),
        _end(second, "failed"),
    ]
    await store.append("s", events, expected_sequence=0)


async def test_a_replay_of_many_pages_is_gapless_and_stops_at_each_turn_s_end() -> None:
    store = MemoryStore()
    await _two_turns(store, 25, 60)
    hub = EventHub()
    turn_1 = [b async for b in follow(store, hub, "s", from_sequence=0, batch_limit=7)]
    assert [e.sequence for b in turn_1 for e in b.decode()] == list(range(1, 26))
    assert [b.last_sequence for b in turn_1] == [7, 14, 21, 25]
    assert [b.terminal for b in turn_1] == [False, False, False, True]
    turn_2 = [b async for b in follow(store, hub, "s", from_sequence=10, batch_limit=7)]
    assert [e.sequence for b in turn_2 for e in b.decode()] == list(range(11, 26))
    rest = [b async for b in follow(store, hub, "s", from_sequence=25, batch_limit=7)]
    assert [e.sequence for b in rest for e in b.decode()] == list(range(26, 61))


class _MessagesOnly:
    """A store without ``read_encoded``: ``follow`` serializes what ``read`` gives."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.reads: list[int] = []

    async def read(self, session_id: str, **kwargs: Any) -> list[pb.StreamEvent]:
        self.reads.append(kwargs["from_sequence"])
        return await self._store.read(session_id, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "read_encoded":
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_a_store_without_encoded_pages_replays_alike() -> None:
    store = MemoryStore()
    await _two_turns(store, 25, 60)
    plain = _MessagesOnly(store)
    assert not isinstance(plain, EncodedEventReader)
    hub = EventHub()
    batches = [b async for b in follow(plain, hub, "s", from_sequence=3, batch_limit=7)]
    assert [e.sequence for b in batches for e in b.decode()] == list(range(4, 26))
    assert batches[-1].terminal
    assert plain.reads == [3, 10, 17, 24]  # each page read once: the one ahead is used


async def test_a_reader_that_stops_drops_the_page_read_ahead() -> None:
    store = MemoryStore()
    await _two_turns(store, 25, 60)
    started: list[asyncio.Task[Any]] = []
    original = store.read_encoded

    async def slow(session_id: str, **kwargs: Any) -> list[bytes]:
        task = asyncio.current_task()
        assert task is not None
        started.append(task)
        if len(started) > 1:
            await asyncio.sleep(10)
        return await original(session_id, **kwargs)

    store.read_encoded = slow  # type: ignore[method-assign]
    stream = follow(store, EventHub(), "s", from_sequence=0, batch_limit=7)
    assert isinstance(stream, AsyncGenerator)
    first = await anext(stream)
    assert first.last_sequence == 7
    await asyncio.sleep(0)
    assert len(started) == 2  # the next page's read began while the first was handed out
    await stream.aclose()
    await asyncio.wait([started[1]], timeout=1)
    assert started[1].cancelled()
