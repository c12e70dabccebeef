"""The store suite: listing one owner's sessions (``SessionIndex``)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from helix_transport._events import SessionStatus
from helix_transport.store import LIST_LIMIT, SessionQuery, SessionRecord, SessionUpdate, Store
from helix_transport.testing.store_suite._helpers import make_record

ALICE = SessionQuery(principal="alice", tenant="acme")


async def listed(store: Store, query: SessionQuery, *, limit: int) -> list[str]:
    """Every id ``query`` lists, page after page of at most ``limit``."""
    ids: list[str] = []
    while True:
        page = await store.query_sessions(query, limit=limit)
        assert len(page.records) <= limit
        ids += [record.session_id for record in page.records]
        if page.next_after is None:
            return ids
        assert page.next_after != query.after, "a page must move on"
        query = dataclasses.replace(query, after=page.next_after)


async def alices(store: Store, *names_and_times: tuple[str, float], **fields: object) -> None:
    for session_id, created_at in names_and_times:
        record = make_record(
            session_id, principal="alice", tenant="acme", created_at=created_at, **fields
        )
        await store.create_session(record)


class ListingConformance:
    """``query_sessions``: order, paging, filters and owner scoping."""

    pytestmark = pytest.mark.asyncio

    async def test_newest_first_ties_by_id_descending(self, store: Store) -> None:
        await alices(store, ("s-b", 10.0), ("s-a", 30.0), ("s-c", 20.0), ("s-d", 20.0))
        page = await store.query_sessions(ALICE, limit=10)
        assert [r.session_id for r in page.records] == ["s-a", "s-d", "s-c", "s-b"]
        assert page.next_after is None
        first = page.records[0]
        assert first == await store.get_session("s-a")  # whole records, every field

    async def test_pages_cover_everything_once(self, store: Store) -> None:
        # Ties across a page boundary are the case keyset paging gets wrong.
        await alices(store, *((f"s-{n:02}", float(n // 3)) for n in range(20)))
        expected = [f"s-{n:02}" for n in reversed(range(20))]
        for limit in (1, 2, 3, 7, 20, 50):
            assert await listed(store, ALICE, limit=limit) == expected, limit
        page = await store.query_sessions(ALICE, limit=10)
        assert page.next_after is not None
        last = await store.query_sessions(
            dataclasses.replace(ALICE, after=page.next_after), limit=10
        )
        assert len(last.records) == 10 and last.next_after is None  # no empty page to end

    async def test_limits(self, store: Store) -> None:
        await alices(store, ("s-1", 1.0), ("s-2", 2.0))
        assert (await store.query_sessions(ALICE, limit=0)).records == []
        assert (await store.query_sessions(ALICE, limit=-5)).records == []
        page = await store.query_sessions(ALICE, limit=LIST_LIMIT * 10)
        assert [r.session_id for r in page.records] == ["s-2", "s-1"]

    async def test_paging_is_stable_while_sessions_are_added(self, store: Store) -> None:
        await alices(store, *((f"s-old-{n:02}", 100.0 + n) for n in range(12)))
        before = await listed(store, ALICE, limit=100)
        pages: list[str] = []
        query = ALICE

        async def add_newer() -> None:
            for n in range(12):
                await alices(store, (f"s-new-{n:02}", 1000.0 + n))
                await asyncio.sleep(0)

        async def read_pages() -> None:
            nonlocal query
            while True:
                page = await store.query_sessions(query, limit=5)
                pages.extend(r.session_id for r in page.records)
                if page.next_after is None:
                    return
                query = dataclasses.replace(query, after=page.next_after)
                await asyncio.sleep(0)

        first = await store.query_sessions(query, limit=5)
        pages.extend(r.session_id for r in first.records)
        assert first.next_after is not None
        query = dataclasses.replace(query, after=first.next_after)
        await asyncio.gather(add_newer(), read_pages())
        assert pages == before  # nothing new slipped in, nothing shifted or repeated
        assert len(await listed(store, ALICE, limit=7)) == 24

    async def test_filters(self, store: Store) -> None:
        await alices(store, ("s-1", 10.0), ("s-2", 20.0), ("s-3", 30.0))
        await alices(store, ("s-child", 25.0), parent_session_id="s-2")
        await alices(store, ("s-critic", 15.0), agent_type="critic")
        await store.update_session("s-3", SessionUpdate(status=SessionStatus.COMPLETED))
        await store.update_session("s-1", SessionUpdate(status=SessionStatus.FAILED))

        def where(**filters: object) -> SessionQuery:
            return dataclasses.replace(ALICE, **filters)  # type: ignore[arg-type]

        done = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED})
        assert await listed(store, where(statuses=done), limit=1) == ["s-3", "s-1"]
        running = frozenset({SessionStatus.RUNNING})
        assert await listed(store, where(statuses=running), limit=1) == [
            "s-child",
            "s-2",
            "s-critic",
        ]
        assert await listed(store, where(agent_type="critic"), limit=2) == ["s-critic"]
        assert await listed(store, where(roots_only=True), limit=2) == [
            "s-3",
            "s-2",
            "s-critic",
            "s-1",
        ]
        # created_after is inclusive, created_before exclusive.
        window = where(created_after=15.0, created_before=30.0)
        assert await listed(store, window, limit=2) == ["s-child", "s-2", "s-critic"]
        both = where(created_after=10.0, roots_only=True, statuses=running, agent_type="researcher")
        assert await listed(store, both, limit=1) == ["s-2"]
        assert await listed(store, where(agent_type="nobody"), limit=5) == []

    async def test_only_the_owners_sessions(self, store: Store) -> None:
        await alices(store, ("s-mine", 1.0))
        others = [
            make_record("s-other-tenant", principal="alice", tenant="globex", created_at=2.0),
            make_record("s-other-principal", principal="bob", tenant="acme", created_at=3.0),
            make_record("s-anonymous", principal="anonymous", created_at=4.0),
            # Written before sessions had owners: anonymous's.
            make_record("s-legacy", created_at=5.0),
        ]
        for record in others:
            await store.create_session(record)
        assert await listed(store, ALICE, limit=10) == ["s-mine"]
        globex = SessionQuery(principal="alice", tenant="globex")
        assert await listed(store, globex, limit=10) == ["s-other-tenant"]
        anonymous = SessionQuery(principal="anonymous")
        assert await listed(store, anonymous, limit=1) == ["s-legacy", "s-anonymous"]
        assert await listed(store, SessionQuery(principal="carol"), limit=10) == []

    async def test_a_record_changed_is_listed_as_it_is_now(self, store: Store) -> None:
        await alices(store, ("s-1", 1.0))
        await store.append("s-1", [], expected_sequence=0)  # nothing, but fenced
        await store.update_session(
            "s-1", SessionUpdate(status=SessionStatus.COMPLETED, output_json="{}")
        )
        (record,) = (await store.query_sessions(ALICE, limit=1)).records
        assert record.status is SessionStatus.COMPLETED
        assert record.finished_at is not None
        assert isinstance(record, SessionRecord)
