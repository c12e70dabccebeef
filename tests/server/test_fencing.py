"""A run that loses its session to another writer stops writing; it never clobbers it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Sequence

import pytest

from helix_transport import ServerConfig, SessionStatus, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import Checkpoint, MemoryStore, SessionRecord, Usage
from helix_transport.store._records import input_fingerprint
from tests.agents import counter
from tests.helpers import assert_eventually


async def test_run_stops_when_another_writer_appends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "10")
    store = MemoryStore()
    async with await create_server(counter, store, allow_unauthenticated=True) as server:
        await server.servicer.Start(
            pb.StartRequest(session_id="s1", input_json=json.dumps({"steps": 20, "words": 5})),
            None,  # type: ignore[arg-type]
        )

        async def started() -> bool:
            record = await store.get_session("s1")
            return record is not None and record.last_sequence >= 5

        await assert_eventually(started)
        # Another owner (a replica that took over) writes to the log.
        record = await store.get_session("s1")
        assert record is not None
        intruder = pb.StreamEvent(
            session_id="s1",
            agent_type="counter",
            run_resumed=pb.RunResumed(step=1, reason="takeover"),
        )
        await store.append("s1", [intruder], expected_sequence=record.last_sequence)

        async def stopped() -> bool:
            return server.runner.running == 0

        await assert_eventually(stopped)
        await asyncio.sleep(0.1)
        after = await store.get_session("s1")

    assert after is not None and after.status is SessionStatus.RUNNING  # not failed, not completed
    assert after.last_sequence == intruder.sequence  # nothing written after the intruder
    assert "another process owns it" in caplog.text
    assert "crashed" not in caplog.text
    assert all(r.levelno < logging.ERROR for r in caplog.records if r.name.startswith("helix"))


def test_errors_from_a_tool_group_are_recognised() -> None:
    from helix_transport._exceptions import SequenceConflict, StoreUnavailable
    from helix_transport.server._runner import _matches

    grouped = ExceptionGroup("step", [ValueError("x"), SequenceConflict("s", 1, 2)])
    assert _matches(grouped, (SequenceConflict,))
    assert _matches(ExceptionGroup("outer", [grouped]), (SequenceConflict,))
    assert not _matches(grouped, (StoreUnavailable,))
    assert _matches(StoreUnavailable("down"), (StoreUnavailable,))


async def test_orphan_scan_leaves_a_session_between_create_and_lease() -> None:
    """A replica's scan must not take a session another replica's Start just created."""
    store = MemoryStore()
    input_json = json.dumps({"steps": 1, "words": 1})

    def record(session_id: str, *, age_s: float) -> SessionRecord:
        return SessionRecord(
            session_id=session_id,
            agent_type="counter",
            input_json=input_json,
            input_hash=input_fingerprint(input_json),
            created_at=time.time() - age_s,
        )

    await store.create_session(record("fresh", age_s=0))
    await store.create_session(record("abandoned", age_s=3600))  # its creator died
    async with await create_server(counter, store, allow_unauthenticated=True) as server:

        async def abandoned_done() -> bool:
            done = await store.get_session("abandoned")
            return done is not None and done.status is SessionStatus.COMPLETED

        await assert_eventually(abandoned_done)
        fresh = await store.get_session("fresh")
        assert fresh is not None
        assert fresh.owner == "" and fresh.last_sequence == 0  # left to its own Start
        assert await server.runner.resume_orphans() == 0


async def test_orphan_scan_resumes_only_sessions_of_its_own_agent_type() -> None:
    """Services of several agent types on one store (as the k8s manifests deploy them):
    a crashed summarizer's session was taken over by the researcher's scan and failed."""
    store = MemoryStore()
    input_json = json.dumps({"steps": 1, "words": 1})
    for session_id, agent_type in (("mine", "counter"), ("theirs", "summarizer")):
        await store.create_session(
            SessionRecord(
                session_id=session_id,
                agent_type=agent_type,
                input_json=input_json,
                input_hash=input_fingerprint(input_json),
                created_at=time.time() - 3600,  # its creator died long ago
            )
        )
    async with await create_server(counter, store, allow_unauthenticated=True) as server:

        async def mine_done() -> bool:
            done = await store.get_session("mine")
            return done is not None and done.status is SessionStatus.COMPLETED

        await assert_eventually(mine_done)
        assert await server.runner.resume_orphans() == 0
    theirs = await store.get_session("theirs")
    assert theirs is not None
    assert (theirs.status, theirs.owner, theirs.last_sequence) == (SessionStatus.RUNNING, "", 0)


class _HeldCreate(MemoryStore):
    """Holds each create_session's answer (the session is already stored) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.created = asyncio.Event()
        self.release = asyncio.Event()

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        answer = await super().create_session(record, lease_ttl_s=lease_ttl_s)
        self.created.set()
        await self.release.wait()
        return answer


async def test_a_session_is_created_leased_and_the_scan_leaves_it_to_its_start() -> None:
    # Start creates the session leased to this replica, in one store call. Until its run
    # is registered, this replica's orphan scan must not take it for a session it left
    # behind before a restart (its owner is our own id): one fresh run, never a resume.
    store = _HeldCreate()
    async with await create_server(counter, store, allow_unauthenticated=True) as server:
        start = asyncio.create_task(
            server.servicer.Start(
                pb.StartRequest(session_id="s1", input_json=json.dumps({"steps": 1, "words": 1})),
                None,  # type: ignore[arg-type]
            )
        )
        await asyncio.wait_for(store.created.wait(), 5)
        held = await store.get_session("s1")
        assert held is not None and held.owner == server.runner.owner
        assert held.lease_expires_at > time.time()
        assert await server.runner.resume_orphans() == 0
        store.release.set()
        await asyncio.wait_for(start, 5)

        async def done() -> bool:
            record = await store.get_session("s1")
            return record is not None and record.status is SessionStatus.COMPLETED

        await assert_eventually(done)
    kinds = [event.WhichOneof("payload") for event in await store.read("s1")]
    assert kinds.count("run_started") == 1 and "run_resumed" not in kinds


class _CheckpointReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.checkpoint_reads = 0

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        self.checkpoint_reads += 1
        return await super().load_checkpoint(session_id)


async def test_a_fresh_session_reads_no_checkpoint() -> None:
    store = _CheckpointReads()
    async with await create_server(counter, store, allow_unauthenticated=True) as server:
        await server.servicer.Start(
            pb.StartRequest(session_id="s1", input_json=json.dumps({"steps": 2, "words": 1})),
            None,  # type: ignore[arg-type]
        )

        async def done() -> bool:
            record = await store.get_session("s1")
            return record is not None and record.status is SessionStatus.COMPLETED

        await assert_eventually(done)
    assert store.checkpoint_reads == 0


async def test_a_run_from_a_stale_empty_record_is_fenced_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    async with await create_server(counter, store, allow_unauthenticated=True) as server:
        stale, _ = await store.create_session(
            SessionRecord(
                session_id="s1",
                agent_type="counter",
                input_json=json.dumps({"steps": 2, "words": 1}),
                input_hash="h",
                status=SessionStatus.RUNNING,
            )
        )
        # Another replica ran it meanwhile: its log and checkpoint exist, the record we
        # hold says the log is empty.
        other = pb.StreamEvent(session_id="s1", agent_type="counter", run_started=pb.RunStarted())
        await store.append("s1", [other], expected_sequence=0)
        await store.save_checkpoint(
            Checkpoint(session_id="s1", step=0, messages=[], usage=Usage(), last_sequence=1)
        )
        assert await server.runner.start(stale)

        async def stopped() -> bool:
            return server.runner.running == 0

        await assert_eventually(stopped)
    assert [e.sequence for e in await store.read("s1")] == [1]  # nothing written over it
    assert "another process owns it" in caplog.text


class _TakeoverClock(MemoryStore):
    """A memory store that records when each lease was acquired.

    Polling the record's owner would race the run: a one-step run takes the lease,
    finishes and releases it between two polls, and the owner reads "" again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.acquired_at: dict[str, float] = {}

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        taken = await super().acquire_lease(session_id, owner, ttl_s=ttl_s)
        if taken:
            self.acquired_at.setdefault(session_id, time.time())
        return taken


async def test_a_lapsing_lease_is_taken_over_right_after_it_lapses() -> None:
    """Not at the next scan a whole TTL later: a dead replica's work resumes sooner."""
    store = _TakeoverClock()
    input_json = json.dumps({"steps": 1, "words": 1})
    now = time.time()
    await store.create_session(
        SessionRecord(
            session_id="held",
            agent_type="counter",
            input_json=input_json,
            input_hash=input_fingerprint(input_json),
            created_at=now - 60,
            owner="a-replica-that-died",
            lease_expires_at=now + 0.5,  # it renewed last half a TTL before dying
        )
    )
    config = ServerConfig(lease_ttl_s=5.0)
    async with await create_server(counter, store, config, allow_unauthenticated=True):

        async def taken_over() -> bool:
            return "held" in store.acquired_at

        await assert_eventually(taken_over, timeout_s=4.0)
    seen_after_s = store.acquired_at["held"] - now
    # Once the lease lapsed (0.5 s), long before the 5 s scan, and not at the quarter
    # TTL the scan used to wait at least (1.25 s here; 250 ms of scenario 8's 1 s TTL).
    assert 0.5 <= seen_after_s < 1.1


class _LeaseHeldElsewhere(MemoryStore):
    """A store whose leases another clock judges: every lease is held, even one that
    lapsed by ours (a Redis or PostgreSQL server's clock lagging the replica's)."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        self.scans += status is SessionStatus.RUNNING  # the orphan scan's listing
        return await super().list_sessions(status=status)

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        return False


async def test_a_lease_lapsed_by_our_clock_but_held_is_not_scanned_in_a_busy_loop() -> None:
    store = _LeaseHeldElsewhere()
    input_json = json.dumps({"steps": 1, "words": 1})
    now = time.time()
    await store.create_session(
        SessionRecord(
            session_id="held",
            agent_type="counter",
            input_json=input_json,
            input_hash=input_fingerprint(input_json),
            created_at=now - 60,
            owner="a-replica-on-another-clock",
            lease_expires_at=now - 1,
        )
    )
    config = ServerConfig(lease_ttl_s=0.4)  # a scan every 0.1 s at most
    async with await create_server(counter, store, config, allow_unauthenticated=True):
        await asyncio.sleep(1.0)
    assert 2 <= store.scans <= 12  # ~10 at a quarter TTL; a busy loop would be thousands


class _RenewalLog(MemoryStore):
    """A memory store that records each ``renew_leases`` call's ids."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[list[str]] = []

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        self.renewals.append(sorted(session_ids))
        return await super().renew_leases(session_ids, owner, ttl_s=ttl_s)


async def test_every_run_s_lease_is_renewed_in_one_store_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "10")
    store = _RenewalLog()
    config = ServerConfig(lease_ttl_s=0.6)  # renewed every 0.2 s
    ids = ["r1", "r2", "r3"]
    async with await create_server(counter, store, config, allow_unauthenticated=True) as server:
        for session_id in ids:
            request = pb.StartRequest(
                session_id=session_id, input_json=json.dumps({"steps": 50, "words": 5})
            )
            await server.servicer.Start(request, None)  # type: ignore[arg-type]

        async def renewed_together() -> bool:
            return ids in store.renewals

        await assert_eventually(renewed_together, timeout_s=3.0)
        for session_id in ids:
            record = await store.get_session(session_id)
            assert record is not None and record.owner == server.runner.owner
            assert record.lease_expires_at > time.time()

        # A replica takes r2's lease over: the next renewal stops r2's run here, only.
        taken = await store.get_session("r2")
        assert taken is not None
        store._sessions["r2"] = dataclasses.replace(
            taken, owner="another-replica", lease_expires_at=time.time() + 60
        )

        async def r2_stopped() -> bool:
            return server.runner.running == 2

        await assert_eventually(r2_stopped, timeout_s=3.0)
        assert "session r2: lease lost" in caplog.text

        async def without_r2() -> bool:  # no longer this replica's run
            return store.renewals[-1] == ["r1", "r3"]

        await assert_eventually(without_r2, timeout_s=3.0)
