"""The store suite: retention (``RetentionStore`` and the sweep).

Times: a store stamps ``finished_at`` with the caller's clock, so the tests finish the
"old" sessions, note the time, then finish the "recent" ones, and sweep with ``now``
set so that the cutoff falls between the two.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from helix_transport._events import SessionStatus
from helix_transport._metadata import ROOT_SESSION_KEY
from helix_transport.store import (
    Candidate,
    Checkpoint,
    RetentionStore,
    SessionUpdate,
    Store,
    SubSessionRef,
    sweep,
)
from helix_transport.testing.store_suite._helpers import (
    Reopen,
    make_command,
    make_event,
    make_record,
)

RETENTION = timedelta(hours=1)
_GAP_S = 0.05
"""Between the old and the recent ends: far above the clock's resolution."""


async def _start(store: Store, session_id: str, *, root: str = "", parent: str = "") -> None:
    metadata = {ROOT_SESSION_KEY: root} if root else {}
    record = make_record(session_id, metadata=metadata, parent_session_id=parent)
    await store.create_session(record)


async def _finish(store: Store, session_id: str, status: SessionStatus) -> None:
    await store.update_session(session_id, SessionUpdate(status=status))


async def _cutoff_between(store: Store) -> float:
    """``now`` for a sweep whose cutoff falls here: what finished before goes."""
    await asyncio.sleep(_GAP_S)
    cutoff = time.time()
    await asyncio.sleep(_GAP_S)
    return cutoff + RETENTION.total_seconds()


class RetentionConformance:
    """Finished sessions expire with their tree's root; nothing a running tree needs goes."""

    pytestmark = pytest.mark.asyncio

    async def test_the_store_has_the_retention_role(self, store: Store) -> None:
        assert isinstance(store, RetentionStore)

    async def test_a_suspended_session_never_goes(self, store: Store) -> None:
        # A continued session whose new turn waits for input: its record keeps the
        # first turn's end, long past, but it is not finished.
        await _start(store, "waits")
        await _finish(store, "waits", SessionStatus.COMPLETED)
        await store.update_session("waits", SessionUpdate(status=SessionStatus.SUSPENDED))
        await _start(store, "child-of-waits", root="waits", parent="waits")
        await _finish(store, "child-of-waits", SessionStatus.COMPLETED)
        now = await _cutoff_between(store)
        assert (await sweep(store, retention=RETENTION, now=now)).expired == []
        assert await store.get_session("waits") is not None

    async def test_exactly_the_expired_finished_sessions_go(self, store: Store) -> None:
        for session_id in ("old", "running", "recent", "root-run", "root-old", "root-new"):
            await _start(store, session_id)
        for child, root in (
            ("child-of-running", "root-run"),
            ("child-of-old", "root-old"),
            ("child-of-new", "root-new"),
            ("child-of-elsewhere", "root-in-another-store"),
        ):
            await _start(store, child, root=root, parent=root)
        await _start(store, "grandchild", root="root-old", parent="child-of-old")
        await _start(store, "no-root-key", parent="root-run")  # started outside the library
        old = ["old", "root-old", "child-of-old", "grandchild", "child-of-running"]
        old += ["child-of-new", "child-of-elsewhere", "no-root-key"]
        for index, session_id in enumerate(old):
            status = list(SessionStatus)[1 + index % 4]  # every terminal status
            await _finish(store, session_id, status)
        now = await _cutoff_between(store)
        await _finish(store, "recent", SessionStatus.COMPLETED)
        await _finish(store, "root-new", SessionStatus.COMPLETED)

        report = await sweep(store, retention=RETENTION, now=now, batch_size=3)

        gone = {"old", "root-old", "child-of-old", "grandchild", "child-of-elsewhere"}
        assert sorted(report.expired) == sorted(gone)
        for session_id in gone:
            assert await store.get_session(session_id) is None, session_id
        kept = {"running", "recent", "root-run", "root-new", "child-of-running", "child-of-new"}
        for session_id in kept | {"no-root-key"}:  # its parent, taken for its root, runs
            assert await store.get_session(session_id) is not None, session_id

    async def test_everything_of_an_expired_session_goes_together(self, store: Store) -> None:
        assert isinstance(store, RetentionStore)
        await _start(store, "p")
        await _start(store, "other")
        await store.append("p", [make_event("a"), make_event("b")], expected_sequence=0)
        await store.save_checkpoint(
            Checkpoint(session_id="p", step=1, messages=[], last_sequence=2)
        )
        await store.set_interrupt("p", "stop", abort=True)
        await store.put_answer("p", "call-1", '{"approved": false, "reason": "no"}')
        await store.put_answer("other", "call-1", '{"error": "timed out"}')
        ref = SubSessionRef(
            parent_session_id="p", child_session_id="c", agent_type="critic", tool_call_id="t"
        )
        await store.put_subsession_ref(ref)
        theirs = make_command("other", "c-9")
        await store.put_commands([make_command("p", "c"), make_command("p", "c-2"), theirs])
        await _finish(store, "p", SessionStatus.FAILED)
        now = await _cutoff_between(store)

        assert (await sweep(store, retention=RETENTION, now=now)).expired == ["p"]

        assert await store.get_session("p") is None
        assert await store.read("p") == []
        assert await store.load_checkpoint("p") is None
        assert await store.take_interrupt("p") is None
        assert await store.list_answers("p") == {}
        assert await store.list_answers("other") == {"call-1": '{"error": "timed out"}'}
        assert await store.list_subsession_refs("p") == []
        assert await store.get_subsession_ref("p", "c") is None
        assert await store.list_commands() == [theirs]
        assert await store.list_sessions(status=SessionStatus.FAILED) == []
        tombstone = await store.get_tombstone("p")
        assert tombstone is not None and tombstone.session_id == "p"
        assert await store.get_tombstone("other") is None

    async def test_a_tombstone_keeps_the_owner_and_goes_in_its_time(self, store: Store) -> None:
        assert isinstance(store, RetentionStore)
        await store.create_session(make_record("s", principal="bob", tenant="acme"))
        await _finish(store, "s", SessionStatus.COMPLETED)
        cutoff = time.time() + 1
        (candidate,) = await store.finished_sessions(finished_before=cutoff, after=None, limit=10)
        each = Candidate(session_id="s", root_session_id="s")
        assert candidate.session_id == "s"
        # Kept 3 s: long enough to be read back on a loaded machine, short enough to wait for.
        removed = await store.expire_sessions([each], finished_before=cutoff, keep_tombstone_s=3)
        assert removed == ["s"]
        tombstone = await store.get_tombstone("s")
        assert tombstone is not None
        assert (tombstone.principal, tombstone.tenant) == ("bob", "acme")
        assert tombstone.expired_at <= time.time()
        assert tombstone.kept_until - tombstone.expired_at == pytest.approx(3, abs=0.01)
        deadline = time.monotonic() + 30
        while await store.get_tombstone("s") is not None:  # a loaded machine: wait for it
            assert time.monotonic() < deadline, "the tombstone outlived its time"
            await store.drop_tombstones(kept_until=time.time(), limit=10)
            await asyncio.sleep(0.1)

    async def test_a_session_or_root_running_again_is_kept(self, store: Store) -> None:
        await _start(store, "root")
        await _start(store, "companion", root="root", parent="root")
        await _start(store, "alone")
        for session_id in ("companion", "root", "alone"):
            await _finish(store, session_id, SessionStatus.COMPLETED)
        now = await _cutoff_between(store)
        # A Continue: the root runs a new turn (and will consult its companion again).
        await store.update_session("root", SessionUpdate(status=SessionStatus.RUNNING))
        await store.update_session("alone", SessionUpdate(status=SessionStatus.RUNNING))

        assert (await sweep(store, retention=RETENTION, now=now)).expired == []
        for session_id in ("root", "companion", "alone"):
            assert await store.get_session(session_id) is not None
        # Its new turn ends after the cutoff: still kept, until a later sweep.
        await _finish(store, "root", SessionStatus.COMPLETED)
        assert (await sweep(store, retention=RETENTION, now=now)).expired == []
        later = time.time() + RETENTION.total_seconds() + 1
        expired = (await sweep(store, retention=RETENTION, now=later)).expired
        assert sorted(expired) == ["companion", "root"]
        assert await store.get_session("alone") is not None

    async def test_a_dry_run_removes_nothing_and_a_sweep_is_idempotent(self, store: Store) -> None:
        for session_id in ("a", "b", "c"):
            await _start(store, session_id)
            await _finish(store, session_id, SessionStatus.COMPLETED)
        now = await _cutoff_between(store)

        dry = await sweep(store, retention=RETENTION, now=now, dry_run=True)
        assert dry.dry_run and sorted(dry.expired) == ["a", "b", "c"]
        assert await store.get_session("a") is not None
        assert sorted((await sweep(store, retention=RETENTION, now=now)).expired) == dry.expired
        again = await sweep(store, retention=RETENTION, now=now)
        assert again.expired == []

    async def test_concurrent_sweeps_remove_each_session_once(self, store: Store) -> None:
        ids = [f"s-{n:02d}" for n in range(30)]
        for session_id in ids:
            await _start(store, session_id)
            await _finish(store, session_id, SessionStatus.COMPLETED)
        now = await _cutoff_between(store)
        reports = await asyncio.gather(
            *(sweep(store, retention=RETENTION, now=now, batch_size=4) for _ in range(3))
        )
        removed = [session_id for report in reports for session_id in report.expired]
        assert sorted(removed) == ids  # every one, and none twice
        for session_id in ids:
            assert await store.get_session(session_id) is None


class DurableRetentionConformance:
    """Two replicas on one store sweep at once."""

    pytestmark = pytest.mark.asyncio

    async def test_two_replicas_sweeping_at_once(self, store: Store, reopen: Reopen) -> None:
        ids = [f"s-{n:02d}" for n in range(40)]
        for session_id in ids:
            await _start(store, session_id)
            await _finish(store, session_id, SessionStatus.INTERRUPTED)
        await _start(store, "live")
        now = await _cutoff_between(store)
        other = await reopen()
        try:
            mine, theirs = await asyncio.gather(
                sweep(store, retention=RETENTION, now=now, batch_size=5),
                sweep(other, retention=RETENTION, now=now, batch_size=5),
            )
        finally:
            await other.aclose()
        assert sorted(mine.expired + theirs.expired) == ids
        assert await store.get_session("live") is not None
        assert await store.list_sessions(status=SessionStatus.INTERRUPTED) == []
