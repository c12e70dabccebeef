"""The helix-mesh command, run as a real process against a server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport.store import MemoryStore
from helix_transport.testing.processes import free_port
from tests.agents import counter
from tests.cli.run import cli as cli  # also imported from here (tests/cli/test_sessions.py)
from tests.helpers import ROOT


async def test_call_status_interrupt_describe() -> None:
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        address = server.address
        code, out, _ = await cli(
            "call", address, "--input", '{"steps": 2, "words": 3}', "--session-id", "c1"
        )
        assert code == 0
        assert "[counter #1] started c1" in out and "→ tick" in out and "completed" in out
        assert json.loads(out[out.rindex("{") :]) == {"total": 2, "steps": 2}

        code, out, _ = await cli("status", address, "c1", "--json")
        assert code == 0 and json.loads(out)["status"] == "completed"

        code, out, _ = await cli("interrupt", address, "c1")
        assert code == 0 and "already finished; nothing changed" in out

        code, out, _ = await cli("describe", address, "--json")
        assert code == 0 and json.loads(out)["agent_type"] == "counter"

        code, out, _ = await cli(
            "call", address, "--follow", "--session-id", "c1", "--json", "--from-sequence", "3"
        )
        lines = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and lines[0]["sequence"] == 4
        # The proto's field names, the output parsed, as `status --json` prints them.
        assert lines[-1]["session_id"] == "c1"
        assert lines[-1]["completed"]["output"] == {"total": 2, "steps": 2}


async def test_a_bad_health_port_is_a_usage_error() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "serve", "tests.agents:counter",
        "--allow-unauthenticated", "--store", "memory://",
        cwd=ROOT, env={**os.environ, "HELIX_HEALTH_PORT": "abc"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2  # argparse's, as for a bad HELIX_PORT: not a traceback
    assert "argument --health-port: invalid int value: 'abc'" in err.decode()


async def test_status_waits_for_a_running_session_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")  # a run of about 4 s
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 20, "words": 10}), session_id="w1")
        code, out, _ = await cli("status", server.address, "w1", "--json")
        assert code == 5 and json.loads(out)["status"] == "running"
        code, out, _ = await cli("status", server.address, "w1", "--wait", "60", "--json")
        assert code == 0 and json.loads(out)["status"] == "completed"
        code, _, err = await cli("status", server.address, "w1", "--wait", "61")
        assert code == 2 and err.strip() == "helix-mesh: wait: longer than 60s; ask again instead"


async def test_errors_are_one_line_and_non_zero() -> None:
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        code, _, err = await cli("status", server.address, "missing")
        assert code == 2 and err.strip() == "helix-mesh: session 'missing' not found"
        code, _, err = await cli("call", server.address, "--input", '{"steps": "x"}')
        assert code == 2 and err.strip().startswith("helix-mesh: input_json.steps:")
        assert "Traceback" not in err


async def test_call_says_it_is_waiting_for_a_service_that_is_not_up_yet() -> None:
    # Before, `call` retried silently for up to 30 s: it looked hung.
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "call", f"127.0.0.1:{port}",
        "--input", '{"steps": 1, "words": 1}', "--session-id", "late",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), timeout=20)
    assert line.decode().strip() == (
        f"helix-mesh: 127.0.0.1:{port} is not serving yet (not listening, starting or "
        "draining); retrying for up to 30 s (Ctrl-C stops)"
    )
    config = ServerConfig(port=port)
    async with await create_server(counter, MemoryStore(), config, allow_unauthenticated=True):
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0
    assert json.loads(out[out.rindex(b"{") :]) == {"total": 1, "steps": 1}


async def test_follow_waits_quietly_for_a_quiet_session(monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-attached at the end of a running session's log, the next event may be seconds
    # away (a long model call): that is not a service out of reach.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "2500")
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 1, "words": 1}), session_id="q1")
        last = (await client.get_status("q1")).last_sequence
        code, out, err = await cli(
            "call", server.address, "--follow", "--session-id", "q1", "--from-sequence", str(last)
        )
        assert code == 0 and "completed" in out
        assert err == ""
        code, _, err = await cli("call", server.address, "--follow", "--session-id", "nope")
        assert code == 2 and err.strip() == "helix-mesh: session 'nope' not found"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("call", "127.0.0.1:1", "--timeout", "0"), "argument --timeout: '0': give a duration above 0"),
        (("call", "127.0.0.1:1", "--timeout", "-1"), "argument --timeout: '-1' is not a duration"),
        (("status", "127.0.0.1:1", "s", "--wait", "nan"), "argument --wait: 'nan' is not a duration"),
        (("serve", "tests.agents:counter", "--heartbeat-interval", "0"), "argument --heartbeat-interval"),
        (("serve", "tests.agents:counter", "--lease-ttl", "x"), "argument --lease-ttl: 'x' is not a duration"),
        (("serve", "tests.agents:counter", "--auth-reload-interval", "-5"), "argument --auth-reload-interval: '-5'"),
    ],
)  # fmt: skip
async def test_a_duration_that_cannot_work_is_refused_by_its_flag(
    args: tuple[str, ...], message: str
) -> None:
    # `call --timeout 0` gave every RPC a deadline already past; `--heartbeat-interval 0`
    # started a server that beats without pause; errors named Python fields, not flags.
    code, _, err = await cli(*args)
    assert code == 2 and message in err, err
