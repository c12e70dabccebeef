"""The store suite: session records."""

from __future__ import annotations

import asyncio
import time

import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound
from helix_transport.store import (
    SessionUpdate,
    Store,
    Usage,
)
from helix_transport.testing.store_suite._helpers import (
    make_event,
    make_record,
)


class SessionConformance:
    """Session records: create, get, update, list."""

    pytestmark = pytest.mark.asyncio

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
            usage=Usage(prompt_tokens=11, completion_tokens=22, total_tokens=33, cost_usd=0.125),
            created_at=1_700_000_000.25,
            updated_at=1_700_000_123.5,
            finished_at=1_700_000_124.75,
            owner="replica-1",
            lease_expires_at=1_700_000_200.125,
            principal="alice",
            tenant="acme",
            deadline=1_700_000_300.5,
            budget_tokens=2**40,
            budget_usd=1.75,
            limit_exceeded="budget_exceeded",
        )
        stored, created = await store.create_session(record)
        assert created is True
        assert stored == record
        assert await store.get_session("s-full") == record
        assert await store.get_session("s-missing") is None

    async def test_limits_are_kept_and_their_end_recorded(self, store: Store) -> None:
        """A session's limits stay as its Start set them (unset ones unset, a zero budget
        zero); which limit ended it is an update like its status, cleared by a new turn."""
        await store.create_session(make_record("s-free"))
        await store.create_session(
            make_record("s-bound", deadline=1_700_000_000.0, budget_tokens=0, budget_usd=0.0)
        )
        free = await store.get_session("s-free")
        assert free is not None
        assert (free.deadline, free.budget_tokens, free.budget_usd) == (None, None, None)
        assert not free.limits.is_set and free.limit_exceeded == ""
        bound = await store.get_session("s-bound")
        assert bound is not None
        assert (bound.deadline, bound.budget_tokens, bound.budget_usd) == (1_700_000_000.0, 0, 0.0)
        ended = SessionUpdate(
            status=SessionStatus.INTERRUPTED,
            limit_exceeded="deadline_exceeded",
            usage=Usage(total_tokens=5, cost_usd=0.5),
        )
        await store.update_session("s-bound", ended)
        got = await store.get_session("s-bound")
        assert got is not None and got.limit_exceeded == "deadline_exceeded"
        assert got.usage.cost_usd == 0.5 and got.budget_tokens == 0
        await store.update_session(
            "s-bound", SessionUpdate(status=SessionStatus.RUNNING, limit_exceeded="")
        )
        again = await store.get_session("s-bound")
        assert again is not None and again.limit_exceeded == "" and again.deadline is not None

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
