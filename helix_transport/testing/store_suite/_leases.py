"""The store suite: leases and the store's lifecycle."""

from __future__ import annotations

import asyncio
import time

import pytest

from helix_transport._exceptions import UsageError
from helix_transport.store import Store
from helix_transport.testing.store_suite._helpers import make_record


class LeaseConformance:
    """Leases and the store's lifecycle."""

    pytestmark = pytest.mark.asyncio

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
