"""The store suite: checkpoints, interrupts and sub-session refs."""

from __future__ import annotations

import asyncio

import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    UsageError,
)
from helix_transport.store import (
    Checkpoint,
    Interrupt,
    InterruptLookup,
    SessionUpdate,
    Store,
    SubSessionRef,
    Usage,
)
from helix_transport.testing.store_suite._helpers import (
    make_event,
    make_record,
    texts,
)


class KeyedStateConformance:
    """Checkpoints, interrupt requests and sub-session refs."""

    pytestmark = pytest.mark.asyncio

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
        assert texts(await store.read("s-1")) == ["a", "b", "c"]
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
        assert texts(await store.read("s-2")) == ["b"]

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
        assert await store.take_interrupt("s-1") == Interrupt("user pressed stop")
        assert await store.take_interrupt("s-1") is None
        await store.set_interrupt("s-1", "")
        assert await store.take_interrupt("s-1") == Interrupt("")
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
        assert await store.take_interrupt("s-1") == Interrupt("stop")  # looking took nothing
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
