"""The store suite: the outbox of child commands."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from helix_transport._exceptions import UsageError
from helix_transport.store import Store
from helix_transport.testing.store_suite._helpers import make_command


class OutboxConformance:
    """The outbox of child commands."""

    pytestmark = pytest.mark.asyncio

    async def test_a_repeated_command_keeps_its_first_created_at(self, store: Store) -> None:
        first = make_command("p", "c", created_at=100.25, reason="user pressed stop")
        await store.put_commands([first])
        await store.record_attempt(first)
        again = make_command(
            "p", "c", address="moved:50051", created_at=200.5, reason="parent interrupted"
        )
        await store.put_commands([again])
        # One row: its first time and attempts, the latest address and reason.
        kept = dataclasses.replace(again, created_at=100.25, attempts=1)
        assert await store.list_commands() == [kept]
        # A key twice in one batch: as if put one after the other.
        await store.put_commands(
            [
                make_command("p", "c-2", created_at=300.0, reason="first"),
                make_command("p", "c-2", address="other:1", created_at=50.0, reason="second"),
            ]
        )
        second = make_command("p", "c-2", address="other:1", created_at=300.0, reason="second")
        assert await store.list_commands() == [kept, second]
        await store.put_commands([])  # nothing to do
        assert await store.list_commands() == [kept, second]

    async def test_concurrent_puts_of_one_command_store_one(self, store: Store) -> None:
        commands = [make_command("p", "c", created_at=1000.0 + n, reason=f"{n}") for n in range(20)]
        await asyncio.gather(*(store.put_commands([command]) for command in commands))
        (stored,) = await store.list_commands()
        assert stored.key == ("p", "c", "interrupt") and stored.attempts == 0
        assert stored.created_at in {command.created_at for command in commands}

    async def test_commands_are_listed_oldest_first_up_to_limit(self, store: Store) -> None:
        # Equal times order by ids, compared by code point ("B" < "a" < "a-b" < "é"),
        # and ids that a plain ':' join would run together stay apart.
        expected = [
            make_command("p", "old", created_at=1.0),
            make_command("B", "c", created_at=5.0),
            make_command("a", "b:c", created_at=5.0),
            make_command("a", "c", created_at=5.0),
            make_command("a-b", "c", created_at=5.0),
            make_command("a:b", "c", created_at=5.0),
            make_command("é", "c", created_at=5.0),
            make_command("p", "new", created_at=9.5, attempts=3),
        ]
        await store.put_commands(expected[4:])
        await store.put_commands(expected[:4][::-1])
        assert await store.list_commands() == expected
        assert await store.list_commands(limit=3) == expected[:3]
        assert await store.list_commands(limit=0) == []
        assert await store.list_commands(limit=-1) == []
        many = [make_command("q", f"c-{n:03}", created_at=10.0 + n) for n in range(120)]
        await store.put_commands(many)
        listed = await store.list_commands()  # 100 by default
        assert listed == (expected + many)[:100]

    async def test_failed_attempts_are_counted(self, store: Store) -> None:
        command = make_command("p", "c")
        await store.put_commands([command, make_command("p", "other")])
        await asyncio.gather(*(store.record_attempt(command) for _ in range(10)))
        stale = dataclasses.replace(command, attempts=0)  # an old copy counts on the stored one
        await store.record_attempt(stale)
        counts = {c.child_session_id: c.attempts for c in await store.list_commands()}
        assert counts == {"c": 11, "other": 0}
        await store.delete_command(command)
        await store.record_attempt(command)  # gone: nothing comes back
        assert [c.child_session_id for c in await store.list_commands()] == ["other"]
        await store.put_commands([command])  # ordered again: a new command, counted anew
        counts = {c.child_session_id: c.attempts for c in await store.list_commands()}
        assert counts == {"c": 0, "other": 0}

    async def test_delete_command_is_idempotent_and_drops_only_its_key(self, store: Store) -> None:
        mine = make_command("p-1", "c-1", created_at=1.0)
        kept = [
            make_command("p-1", "c-2", created_at=2.0),  # a sibling
            make_command("p-2", "c-1", created_at=3.0),  # another parent's child of that id
            make_command("p-3", "c-9", created_at=4.0),
        ]
        await store.put_commands([mine, *kept])
        await store.delete_command(mine)
        assert await store.list_commands() == kept
        await store.delete_command(mine)
        await store.delete_command(make_command("nobody", "nothing"))
        assert await store.list_commands() == kept
        await store.put_commands([mine])  # delivered once, ordered again: a new command
        assert await store.list_commands() == [mine, *kept]

    async def test_a_command_refuses_fields_no_store_can_key_by(self, store: Store) -> None:
        for name, value in (
            ("parent_session_id", ""),
            ("child_session_id", "c\x00"),
            ("address", "host:\ud800"),
            ("kind", "pause"),
            ("created_at", float("nan")),
            ("attempts", -1),
            ("attempts", 2**63),
        ):
            with pytest.raises(UsageError, match=f"ChildCommand.{name}"):
                make_command("p", "c", **{name: value})
        # The reason is free text: stored as every backend can hold it.
        odd = make_command("p", "c", reason="bad\x00byte, lone \ud800")
        assert odd.reason == "bad\ufffdbyte, lone \ufffd"
        await store.put_commands([odd])
        assert await store.list_commands() == [odd]
        largest = make_command("p", "c-2", created_at=odd.created_at + 1, attempts=2**63 - 1)
        await store.put_commands([largest])
        assert await store.list_commands() == [odd, largest]
