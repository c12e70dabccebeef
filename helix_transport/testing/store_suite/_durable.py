"""The store suite: what only a store whose data outlives its object can show."""

from __future__ import annotations

import asyncio
import dataclasses

from helix_transport._events import SessionStatus
from helix_transport.store import (
    Checkpoint,
    Interrupt,
    SessionUpdate,
    Store,
    SubSessionRef,
)
from helix_transport.testing.store_suite._helpers import (
    Reopen,
    append_racing,
    make_command,
    make_event,
    make_record,
)
from helix_transport.testing.store_suite._retention import DurableRetentionConformance
from helix_transport.testing.store_suite._suite import StoreConformance


class DurableStoreConformance(StoreConformance, DurableRetentionConformance):
    """The suite plus what only a store whose data outlives its object can show."""

    async def test_data_survives_a_new_instance(self, store: Store, reopen: Reopen) -> None:
        checkpoint = Checkpoint(
            session_id="s-1", step=1, messages=[{"role": "user"}], last_sequence=2
        )
        ref = SubSessionRef(
            parent_session_id="s-1",
            child_session_id="c-1",
            agent_type="critic",
            tool_call_id="call-1",
        )
        await store.create_session(make_record(metadata={"k": "v"}))
        await store.append(
            "s-1",
            [make_event("a"), make_event("b")],
            expected_sequence=0,
            update=SessionUpdate(status=SessionStatus.COMPLETED),
        )
        await store.save_checkpoint(checkpoint)
        await store.set_interrupt("s-1", "stop", abort=True)
        await store.put_subsession_ref(ref)
        assert await store.acquire_lease("s-1", "A", ttl_s=60)
        stored = await store.get_session("s-1")
        await store.aclose()

        second = await reopen()
        try:
            assert await second.get_session("s-1") == stored
            assert stored is not None and stored.status is SessionStatus.COMPLETED
            log = await second.read("s-1")
            assert [(e.sequence, e.text_delta.text) for e in log] == [(1, "a"), (2, "b")]
            assert await second.load_checkpoint("s-1") == checkpoint
            assert await second.take_interrupt("s-1") == Interrupt("stop", abort=True)
            assert await second.list_subsession_refs("s-1") == [ref]
            assert await second.list_sessions(status=SessionStatus.COMPLETED) == [stored]
            assert await second.acquire_lease("s-1", "B", ttl_s=60) is False
            assert await second.append("s-1", [make_event("c")], expected_sequence=2) == 3
        finally:
            await second.aclose()

    async def test_two_instances_share_one_log(self, store: Store, reopen: Reopen) -> None:
        # Two instances stand in for two processes: separate connections, one log.
        other = await reopen()
        try:
            await store.create_session(make_record())

            async def writer(target: Store, name: str) -> None:
                end = 0
                for i in range(25):
                    end = await append_racing(target, "s-1", make_event(f"{name}-{i}"), end=end)

            await asyncio.gather(writer(store, "x"), writer(other, "y"))
            log = await other.read("s-1")
            assert [e.sequence for e in log] == list(range(1, 51))
            assert len({e.text_delta.text for e in log}) == 50
        finally:
            await other.aclose()

    async def test_two_instances_race_for_one_answer(self, store: Store, reopen: Reopen) -> None:
        # Two processes handed the same request (a SubmitInput retried at another
        # replica, a person answering twice): one answer wins, and both see it.
        other = await reopen()
        try:
            first = [f'{{"approved": true, "reason": "x{n}"}}' for n in range(10)]
            second = [f'{{"approved": false, "reason": "y{n}"}}' for n in range(10)]
            results = await asyncio.gather(
                *(store.put_answer("s-1", "call-1", answer) for answer in first),
                *(other.put_answer("s-1", "call-1", answer) for answer in second),
            )
            stored = [answer for answer, created in results if created]
            assert len(stored) == 1, results
            assert {answer for answer, _ in results} == set(stored)
        finally:
            await other.aclose()
        await store.aclose()
        again = await reopen()
        try:
            assert await again.list_answers("s-1") == {"call-1": stored[0]}
        finally:
            await again.aclose()

    async def test_commands_survive_a_new_instance(self, store: Store, reopen: Reopen) -> None:
        # The outbox outlives the parent's process, and any replica can deliver it.
        first = make_command("p-1", "c-1", created_at=1_700_000_000.125, reason="stop")
        second = make_command("p-2", "c-1", address="critic:50051", created_at=1_700_000_001.5)
        await store.put_commands([first, second])
        await store.record_attempt(first)
        await store.aclose()
        replica = await reopen()
        try:
            counted = dataclasses.replace(first, attempts=1)
            assert await replica.list_commands() == [counted, second]
            await replica.delete_command(counted)
            await replica.record_attempt(second)
        finally:
            await replica.aclose()
        again = await reopen()
        try:
            assert await again.list_commands() == [dataclasses.replace(second, attempts=1)]
        finally:
            await again.aclose()
