"""``helix-mesh tree`` (a real process) over a delegation tree three levels deep on
three services on 127.0.0.1: drawn from the root's log alone (it still draws with the
child services stopped), as JSON, live on a pipe and redrawn in place on a terminal."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest

from helix_transport import AgentClient, AgentServer, create_server
from helix_transport.cli.exits import ExitCode
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents import counter, delegator, looper, middle
from tests.cli.run import cli, cli_on_a_terminal

TREE_INPUT = json.dumps(
    {
        "calls": [
            {"tool": "count", "args": {"steps": 2, "words": 2}},
            {"tool": "delegate", "args": {"calls": [{"tool": "count", "args": {"steps": 1}}]}},
            {"tool": "loop", "args": {}},  # fails on max_steps; the root goes on
        ]
    }
)


@dataclass
class Mesh:
    root: str
    """The delegator's address."""
    servers: dict[str, AgentServer]
    client: AgentClient


@pytest.fixture
async def mesh(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Mesh]:
    async with AsyncExitStack() as stack:
        servers: dict[str, AgentServer] = {}
        for agent in (counter, looper, middle, delegator):
            server = await create_server(agent, MemoryStore(), allow_unauthenticated=True)
            servers[agent.name] = await stack.enter_async_context(server)
            monkeypatch.setenv(address_env_var(agent.name), server.address)
        address = servers["delegator"].address
        client = await stack.enter_async_context(await AgentClient.connect(address))
        yield Mesh(root=address, servers=servers, client=client)


Shape = tuple[str, str, list[Any]]


def shape(node: dict[str, Any]) -> Shape:
    return node["agent_type"], node["status"], [shape(child) for child in node["children"]]


EXPECTED: Shape = (
    "delegator",
    "completed",
    [
        ("counter", "completed", []),
        ("middle", "completed", [("counter", "completed", [])]),
        ("looper", "failed", []),
    ],
)


async def test_the_tree_from_the_roots_log_alone(mesh: Mesh) -> None:
    await mesh.client.start(TREE_INPUT, session_id="r")
    await mesh.client.wait("r")

    code, out, _ = await cli("tree", mesh.root, "r", "--json")
    tree = json.loads(out)
    assert code == ExitCode.COMPLETED and shape(tree) == EXPECTED
    assert tree["session_id"] == "r" and tree["output"]["results"][0] == {"total": 2, "steps": 2}
    counted = tree["children"][0]
    assert counted["tool_call_id"] == "call_1_0" and counted["step_count"] == 3
    assert counted["address"] == mesh.servers["counter"].address
    assert set(counted["usage"]) == {"own", "total"} and counted["started_at"].endswith("Z")
    assert tree["children"][2]["error"] == "no output after 3 steps"

    code, text, _ = await cli("tree", mesh.root, "r")
    lines = text.splitlines()
    assert code == ExitCode.COMPLETED and len(lines) == 5
    assert re.match(
        r"delegator  completed  [\d.]+ m?s  2 steps completed  [\d,]+ tokens, [\d,]+ with children  r$",
        lines[0],
    )
    assert lines[1].startswith("├─ counter call_1_0  completed  ")
    assert lines[2].startswith("├─ middle call_1_1  completed  ")
    assert lines[3].startswith("│  └─ counter call_1_0  completed  ")
    assert (
        lines[4].startswith("└─ looper call_1_2  failed  ")
        and "no output after 3 steps" in lines[4]
    )

    # Every child's service gone: the root's log still holds the whole tree.
    for name in ("counter", "middle", "looper"):
        await mesh.servers[name].shutdown(grace_s=0)
    code, again, _ = await cli("tree", mesh.root, "r", "--json")
    assert code == ExitCode.COMPLETED and json.loads(again) == tree


async def test_a_running_tree_is_shown_as_far_as_it_went(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "30")
    slow = {"calls": [{"tool": "count", "args": {"steps": 40, "words": 10}}]}
    await mesh.client.start(json.dumps(slow), session_id="slow")
    code, out, _ = await cli("tree", mesh.root, "slow", "--json")
    tree = json.loads(out)
    assert code == ExitCode.RUNNING and tree["status"] == "running"
    await mesh.client.interrupt("slow")


async def test_follow_appends_on_a_pipe_and_redraws_on_a_terminal(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "30")
    # Seconds of work (40 steps of 9 chunks), so each follower attaches while it runs.
    slow = {
        "calls": [
            {"tool": "count", "args": {"steps": 1}},
            {"tool": "count", "args": {"steps": 40, "words": 8}},
        ]
    }
    for session_id in ("json", "pipe", "tty"):
        await mesh.client.start(json.dumps(slow), session_id=session_id)
    (code, out, _), (pipe_code, piped, _), (tty_code, shown) = await asyncio.gather(
        cli("tree", mesh.root, "json", "--follow", "--json"),
        cli("tree", mesh.root, "pipe", "--follow"),
        cli_on_a_terminal("tree", mesh.root, "tty", "--follow"),
    )
    done: Shape = ("delegator", "completed", [("counter", "completed", [])] * 2)

    copies = [json.loads(line) for line in out.splitlines()]
    assert code == ExitCode.COMPLETED and len(copies) > 3
    assert copies[0]["status"] == "running" and shape(copies[-1]) == done
    assert len({json.dumps(copy) for copy in copies}) == len(copies)  # each one a change
    # The first copy is the tree as far as it went, not its first event's.
    assert copies[0]["children"] and copies[0]["step_count"] == 0

    frames = piped.split("\n\n")
    assert pipe_code == ExitCode.COMPLETED and len(frames) > 3 and "\x1b[" not in piped
    assert frames[0].startswith("delegator  running") and len(frames[0].splitlines()) == 3
    assert frames[-2].startswith("delegator  completed") and frames[-1] == ""

    assert tty_code == ExitCode.COMPLETED
    # Each frame goes back over the last (cursor up N lines, clear) and draws anew.
    assert re.search(r"\x1b\[3F\x1b\[J", shown), shown
    last_frame = shown.rsplit("\x1b[J", 1)[1]
    assert "\x1b[1mdelegator\x1b[0m  \x1b[32mcompleted\x1b[0m" in last_frame
    assert len(last_frame.splitlines()) == 3


async def test_following_a_finished_tree_prints_it_once(mesh: Mesh) -> None:
    await mesh.client.start(TREE_INPUT, session_id="old")
    await mesh.client.wait("old")
    code, out, _ = await cli("tree", mesh.root, "old", "--follow", "--json")
    assert code == ExitCode.COMPLETED and len(out.splitlines()) == 1
    assert shape(json.loads(out)) == EXPECTED
