"""The CLI's conventions, with the CLI as a real process against servers on 127.0.0.1:
one exit code per outcome (the table in helix_transport/cli/exits.py and docs/cli.md),
``--json`` that is real JSON, ``NO_COLOR``, ``--input -``, ``--version``, ``status
--include-children``, and ``call --follow`` over every turn of a continued session."""

from __future__ import annotations

import importlib.metadata
import json
import re

import pytest

from helix_transport import AgentClient, create_server
from helix_transport.cli.exits import ExitCode
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from helix_transport.testing.processes import free_port
from services.critic import agent as critic
from tests.agents import counter, delegator, looper
from tests.cli.run import cli, cli_on_a_terminal
from tests.helpers import ROOT

SHORT = json.dumps({"steps": 1, "words": 2})
LONG = json.dumps({"steps": 50, "words": 20})  # ~20 s at 20 ms a chunk: stopped long before


async def test_each_outcome_has_its_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as counting,
        await create_server(looper, MemoryStore(), allow_unauthenticated=True) as looping,
        await AgentClient.connect(counting.address) as client,
    ):
        address = counting.address
        code, _, err = await cli("call", address, "--input", SHORT, "--session-id", "done")
        assert code == ExitCode.COMPLETED, err
        assert (await cli("status", address, "done"))[0] == ExitCode.COMPLETED

        # The looper never finishes: it fails on max_steps.
        code, out, _ = await cli("call", looping.address, "--input", SHORT, "--session-id", "f")
        assert code == ExitCode.FAILED and "failed (max_steps)" in out
        assert (await cli("status", looping.address, "f"))[0] == ExitCode.FAILED

        await client.start(LONG, session_id="long")
        code, out, _ = await cli("status", address, "long")
        assert code == ExitCode.RUNNING and "running for" in out
        await client.interrupt("long", reason="enough")
        code, out, _ = await cli("call", address, "--follow", "--session-id", "long")
        assert code == ExitCode.INTERRUPTED and "interrupted: enough" in out
        assert (await cli("status", address, "long"))[0] == ExitCode.INTERRUPTED

        # Bad input: refused before anything is sent, by the service, or not found.
        code, _, err = await cli("call", "127.0.0.1:1", "--input", "{bad")
        assert code == ExitCode.USAGE and err.startswith("helix-mesh: --input: not JSON"), err
        code, _, err = await cli("call", address, "--input", '{"steps": "x"}')
        assert code == ExitCode.USAGE and "input_json.steps" in err
        code, _, err = await cli("status", address, "missing")
        assert code == ExitCode.USAGE and err.strip() == "helix-mesh: session 'missing' not found"
        assert (await cli("status", address))[0] == ExitCode.USAGE  # argparse: no session id

    code, _, err = await cli("status", f"127.0.0.1:{free_port()}", "done")
    assert code == ExitCode.UNREACHABLE and "cannot reach agent service" in err
    assert (await cli("describe", f"127.0.0.1:{free_port()}"))[0] == ExitCode.UNREACHABLE


async def test_json_is_real_json_and_text_is_for_people() -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        address = server.address
        code, out, _ = await cli("call", address, "--input", SHORT, "--session-id", "j", "--json")
        events = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert events[0]["run_started"]["input"] == {"steps": 1, "words": 2}
        assert events[-1]["completed"]["output"] == {"total": 1, "steps": 1}

        code, out, _ = await cli("status", address, "j", "--json")
        status = json.loads(out)
        expected = await client.get_status("j")
        assert code == 0 and status["last_sequence"] == expected.last_sequence == len(events)
        assert status["status"] == "completed" and status["output"] == {"total": 1, "steps": 1}
        assert status["usage"]["total_tokens"] == expected.usage.total_tokens > 0
        assert status["created_at"].endswith("Z") and "output_json" not in status
        assert "total_usage" not in status  # only with --include-children

        code, out, _ = await cli("status", address, "j")
        rows = dict(line.split(None, 1) for line in out.splitlines()[:3])
        assert code == 0 and rows == {"session": "j", "agent": "counter", "status": "completed"}
        assert f"last sequence  {len(events)}" in out and '"total": 1' in out

        code, out, _ = await cli("describe", address, "--json")
        described = json.loads(out)
        assert code == 0 and described["agent_type"] == "counter"
        assert set(described["input_schema"]["properties"]) == {"steps", "words"}
        assert described["tool_names"] == ["tick"]
        code, out, _ = await cli("describe", address)
        assert code == 0 and out.startswith("agent  counter\ntools  tick\n")


async def test_colour_on_a_terminal_unless_no_color() -> None:
    async with await create_server(looper, MemoryStore(), allow_unauthenticated=True) as server:
        code, _, _ = await cli("call", server.address, "--input", SHORT, "--session-id", "f")
        assert code == ExitCode.FAILED
        code, shown = await cli_on_a_terminal("status", server.address, "f")
        assert code == ExitCode.FAILED and "\x1b[31mfailed\x1b[0m" in shown
        for empty_is_unset in ("", "1"):
            code, shown = await cli_on_a_terminal(
                "status", server.address, "f", env={"NO_COLOR": empty_is_unset}
            )
            assert ("\x1b[" in shown) is (empty_is_unset == ""), shown  # no-color.org
        code, shown = await cli_on_a_terminal(
            "call", server.address, "--follow", "--session-id", "f", env={"NO_COLOR": "1"}
        )
        assert code == ExitCode.FAILED and "failed (max_steps)" in shown and "\x1b[" not in shown
        code, out, _ = await cli("status", server.address, "f")  # a pipe: never colour
        assert "failed" in out and "\x1b[" not in out


async def test_input_from_standard_input() -> None:
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        code, out, err = await cli("call", server.address, "--input", "-", stdin=SHORT)
        assert code == 0, err
        assert json.loads(out[out.rindex("{\n") :]) == {"total": 1, "steps": 1}
        code, _, err = await cli("call", server.address, "--input", "-", stdin="steps: 1")
        assert code == ExitCode.USAGE and "--input: not JSON" in err


async def test_version() -> None:
    code, out, _ = await cli("--version")
    assert code == 0 and out == f"helix-mesh {importlib.metadata.version('helix-mesh')}\n"


async def test_call_follow_shows_every_turn_of_a_continued_session() -> None:
    async with (
        await create_server(critic, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"artifact": "v1: code"}), session_id="t")
        await client.wait("t")
        turn = await client.continue_session("t", "v2: code and tests", turn=2)
        await client.wait("t", from_sequence=turn.from_sequence)
        last = (await client.get_status("t")).last_sequence

        code, out, _ = await cli("call", server.address, "--follow", "--session-id", "t")
        assert code == 0
        assert out.count("] completed") == 2 and "turn 2 message=v2: code and tests" in out
        assert json.loads(out[out.rindex("{\n") :])["round"] == 2  # the last turn's output

        code, out, _ = await cli("call", server.address, "--follow", "--session-id", "t", "--json")
        sequences = [json.loads(line)["sequence"] for line in out.splitlines()]
        assert code == 0 and sequences == list(range(1, last + 1))  # both turns, gapless


async def test_status_include_children_adds_the_childrens_usage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as child,
        await create_server(delegator, MemoryStore(), allow_unauthenticated=True) as parent,
        await AgentClient.connect(parent.address) as client,
        await AgentClient.connect(child.address) as child_client,
    ):
        monkeypatch.setenv(address_env_var("counter"), child.address)
        calls = {"calls": [{"tool": "count", "args": {"steps": 1, "words": 1}}]}
        await client.start(json.dumps(calls), session_id="p")
        events = [event async for event in client.stream("p")]
        (child_id,) = {
            e.subagent_start.child_session_id
            for e in events
            if e.WhichOneof("payload") == "subagent_start"
        }
        child_usage = (await child_client.get_status(child_id)).usage.total_tokens

        code, out, _ = await cli("status", parent.address, "p", "--include-children", "--json")
        status = json.loads(out)
        own = status["usage"]["total_tokens"]
        assert code == 0 and own > 0 and child_usage > 0
        assert status["total_usage"]["total_tokens"] == own + child_usage
        code, out, _ = await cli("status", parent.address, "p", "--include-children")
        assert f"usage with children  {own + child_usage:,} tokens" in out


def test_the_exit_code_table_in_the_docs_is_the_code() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n\n")[2]
    rows = re.findall(r"^\| (\d+) \| (\w+) \|", table, flags=re.M)
    assert [(int(code), name) for code, name in rows] == [
        (code.value, code.name.lower()) for code in ExitCode
    ]
