"""``helix-mesh sessions``, run as a real process against a server on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from helix_transport import AgentClient, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.sessions import duration, since
from helix_transport.server import app as server_app
from helix_transport.server._servicer import AgentServicer
from helix_transport.store import MemoryStore
from tests.agents import counter
from tests.cli.test_cli import cli


async def test_the_table_and_json_lines_newest_first() -> None:
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        async with await AgentClient.connect(server.address) as client:
            for session_id in ("c-1", "c-2", "c-3"):
                await client.start('{"steps": 1, "words": 1}', session_id=session_id)
                await client.wait(session_id)
        address = server.address

        code, out, err = await cli("sessions", address)
        assert code == 0, err
        header, *rows = out.splitlines()
        assert " ".join(header.split()) == "SESSION ID AGENT TYPE STATUS CREATED DURATION LAST SEQ"
        assert [row.split()[0] for row in rows] == ["c-3", "c-2", "c-1"]
        assert all(row.split()[1:3] == ["counter", "completed"] for row in rows)

        code, out, err = await cli("sessions", address, "--json", "--limit", "2")
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["session_id"] for line in lines] == ["c-3", "c-2"]
        first = lines[0]
        assert first["status"] == "completed" and first["agent_type"] == "counter"
        assert isinstance(first["last_sequence"], int) and first["last_sequence"] > 0
        created = datetime.fromisoformat(first["created_at"])
        assert datetime.fromisoformat(first["finished_at"]) >= created
        assert abs(datetime.now(UTC) - created) < timedelta(minutes=5)

        code, out, err = await cli("sessions", address, "--status", "running", "failed")
        assert (code, out) == (0, "") and "no sessions" in err
        code, out, _ = await cli("sessions", address, "--since", "1h", "--roots", "--json")
        assert code == 0 and len(out.splitlines()) == 3
        code, out, _ = await cli("sessions", address, "--since", "2000-01-01", "--json")
        assert code == 0 and len(out.splitlines()) == 3
        future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        code, out, _ = await cli("sessions", address, "--since", future, "--json")
        assert (code, out) == (0, "")


async def test_bad_flags_are_usage_errors() -> None:
    code, _, err = await cli("sessions", "127.0.0.1:1", "--since", "last tuesday")
    assert code == 2 and "--since" in err
    code, _, err = await cli("sessions", "127.0.0.1:1", "--status", "sleeping")
    assert code == 2 and "--status" in err
    code, _, err = await cli("sessions", "127.0.0.1:1", "--limit", "-3")
    assert code == 2 and "--limit" in err


class WithoutListSessions(AgentServicer):
    """Answers ListSessions as a service that does not implement it."""

    async def ListSessions(self, request: Any, context: Any) -> pb.ListSessionsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        raise AssertionError("abort raises")


async def test_a_service_without_list_sessions_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_app, "AgentServicer", WithoutListSessions)
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        code, out, err = await cli("sessions", server.address)
    assert (code, out) == (1, "")
    assert "does not implement ListSessions" in err


def test_since_reads_durations_and_times() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert since("90s", now=now) == now - timedelta(seconds=90)
    assert since("1h30m", now=now) == now - timedelta(minutes=90)
    assert since("7d", now=now) == now - timedelta(days=7)
    assert since("2026-11-26T09:00:00Z", now=now) == datetime(2026, 11, 26, 9, tzinfo=UTC)
    assert since("2026-11-26T09:00", now=now).tzinfo is not None  # local time, made aware
    with pytest.raises(argparse.ArgumentTypeError):
        since("soon", now=now)
    with pytest.raises(argparse.ArgumentTypeError):
        since("5 parsecs", now=now)


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (0.85, 12.34, 245, 7380, 273600)] == [
        "850ms",
        "12.3s",
        "4m05s",
        "2h03m",
        "3d04h",
    ]
