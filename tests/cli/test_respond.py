"""Answering a request for input with the CLI, end to end: three real service processes
(``tests.agents.approvals``: root -> middle -> mailer, each with its SQLite store), the
mailer's ``send`` waiting for an approval two levels below the root.

``call`` on a terminal asks the person there and sends their answer; without one it
prints the request and the ``respond`` line, and follows the session to its end once
someone answers; ``respond`` finds the request's path in
the root's log and approves it (the tool runs once; a repeat changes nothing, another
answer is refused), or, given the path ``tree --json`` shows, denies it (the tool does
not run); ``status`` and ``tree`` show the session suspended; ``interrupt --abort``
ends the whole tree; ``call --auto-approve`` answers by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from helix_transport import AgentClient
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.agents.approvals import SENT_LOG
from tests.cli.run import CLI_TIMEOUT_S, cli
from tests.helpers import ROOT

TYPES = ("hitl-mailer", "hitl-middle", "hitl-root")


@dataclass
class Mesh:
    root: str
    """The root service's address."""
    sent_log: Path
    """One line per time the mailer's ``send`` really ran."""

    def sent(self, root: str) -> list[dict[str, str]]:
        """The sends of ``root``'s tree (its sessions' ids start with the root's)."""
        if not self.sent_log.exists():
            return []
        lines = [json.loads(line) for line in self.sent_log.read_text().splitlines()]
        return [line for line in lines if line["session_id"].startswith(f"{root}-")]


# One mesh for the module (three processes take 20 s to start on a loaded machine):
# each test's tree has its own root session id, and counts only its own sends.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    tmp_path = tmp_path_factory.mktemp("hitl-cli")
    sent_log = tmp_path / "sent.jsonl"
    env = {"HELIX_LOG_LEVEL": "WARNING", SENT_LOG: str(sent_log)}
    services = {
        name: ServiceProcess(
            f"tests.agents.approvals:{name.removeprefix('hitl-')}",
            port=free_port(),
            store_url=f"sqlite:///{tmp_path / (name + '.db')}",
            log_path=tmp_path / f"{name}.log",
            env=env,
            cwd=ROOT,
        )
        for name in TYPES
    }
    for service in services.values():
        for name in TYPES:
            service.env[address_env_var(name)] = services[name].address
    try:
        await asyncio.gather(*(s.start() for s in services.values()))
        yield Mesh(root=services["hitl-root"].address, sent_log=sent_log)
    finally:
        await asyncio.gather(*(s.stop() for s in services.values()))


async def _until_suspended(address: str, session_id: str) -> None:
    async with await AgentClient.connect(address) as client, asyncio.timeout(CLI_TIMEOUT_S):
        async for event in client.stream(session_id):
            if event.WhichOneof("payload") == "suspended":
                return


async def test_call_shows_the_request_and_respond_approves_it(mesh: Mesh) -> None:
    call = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "call", mesh.root,
        "--input", '{"to": "deep@example.com"}', "--session-id", "r1",
        cwd=ROOT, env={**os.environ, "NO_COLOR": "1"},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert call.stdout is not None
    shown: list[str] = []
    async with asyncio.timeout(CLI_TIMEOUT_S):
        while not shown or "answer it with:" not in shown[-1]:
            line = (await call.stdout.readline()).decode()
            assert line, "".join(shown)
            shown.append(line)
    text = "".join(shown)
    assert "input required: send(" in text and "needs approval" in text
    how = re.search(r"answer it with: helix-mesh respond (\S+) r1 (\S+) --approve\|--deny", text)
    assert how and how.group(1) == mesh.root, text
    request = how.group(2)
    assert mesh.sent("r1") == []  # waiting: nothing ran

    code, out, err = await cli("respond", mesh.root, "r1", request, "--approve", "--reason", "ok")
    assert (code, err) == (0, ""), out
    assert out.startswith(f"{request}: approved (ok) (sent; session ")

    out_rest, err_rest = await asyncio.wait_for(call.communicate(), CLI_TIMEOUT_S)
    rest = out_rest.decode()
    assert call.returncode == 0, (rest, err_rest.decode())
    assert f"✓ {request} approved: ok" in rest and "completed" in rest
    assert json.loads(rest[rest.rindex('{\n  "result"') :])["result"] == [
        {"result": [{"result": [{"sent_to": "deep@example.com"}]}]}
    ]
    assert len(mesh.sent("r1")) == 1

    code, out, _ = await cli("respond", mesh.root, "r1", request, "--approve", "--reason", "ok")
    assert code == 0 and "already answered so; nothing changed" in out
    code, _, err = await cli("respond", mesh.root, "r1", request, "--deny")
    assert code == 2 and err.startswith("helix-mesh: session 'r1'"), err
    assert len(mesh.sent("r1")) == 1


async def test_status_and_tree_show_it_suspended_and_respond_denies_it_by_path(
    mesh: Mesh,
) -> None:
    async with await AgentClient.connect(mesh.root) as client:
        await client.start('{"to": "no@example.com"}', session_id="r2")
    await _until_suspended(mesh.root, "r2")

    code, out, _ = await cli("status", mesh.root, "r2")
    assert code == 5 and re.search(r"^status\s+suspended$", out, re.M), out
    code, out, _ = await cli("tree", mesh.root, "r2")
    assert code == 5 and out.startswith("hitl-root  suspended"), out
    assert "? approval send(" in out
    code, out, _ = await cli("tree", mesh.root, "r2", "--json")
    (request,) = [
        pending for node in _walk(json.loads(out)) for pending in node["pending_requests"]
    ]
    assert request["kind"] == "approval" and request["arguments"] == {
        "to": "no@example.com",
        "body": "hello",
    }
    assert request["path"][0] == "r2" and len(request["path"]) == 3

    code, _, err = await cli("respond", mesh.root, "r2", "call_9_9", "--approve")
    assert code == 2 and "no request 'call_9_9' in the tree of session 'r2'" in err
    code, out, err = await cli(
        "respond", mesh.root, "r2", request["request_id"], "--deny", "--reason", "not today",
        "--path", *request["path"],
    )  # fmt: skip
    assert (code, err) == (0, ""), out
    code, out, _ = await cli("status", mesh.root, "r2", "--wait", "60", "--json")
    assert code == 0, out
    (mailed,) = json.loads(out)["output"]["result"][0]["result"][0]["result"]
    assert "not today" in mailed["error"]
    assert mesh.sent("r2") == []


async def test_interrupt_abort_ends_a_suspended_tree(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.root) as client:
        await client.start('{"to": "gone@example.com"}', session_id="r3")
    await _until_suspended(mesh.root, "r3")
    code, out, _ = await cli("interrupt", mesh.root, "r3", "--abort", "--reason", "changed my mind")
    # Recorded at once, applied as the abort goes down the tree.
    assert code == 0 and re.fullmatch(r"r3: \w+ \(abort recorded\)\n", out), out
    code, out, _ = await cli("tree", mesh.root, "r3", "--follow", "--json")
    assert code == 3, out  # followed through the suspension to the end
    last = json.loads(out.splitlines()[-1])
    assert [n["pending_requests"] for n in _walk(last)] == [[], [], []]
    assert {n["status"] for n in _walk(last)} == {"terminated"}, out
    code, out, _ = await cli("status", mesh.root, "r3", "--json")
    assert code == 3 and json.loads(out)["status"] == "terminated"
    assert mesh.sent("r3") == []


async def test_call_auto_approve_answers_by_itself_and_says_so(mesh: Mesh) -> None:
    code, out, err = await cli(
        "call", mesh.root, "--input", '{"to": "auto@example.com"}', "--auto-approve",
        "--session-id", "r5", env={"NO_COLOR": "1"},
    )  # fmt: skip
    assert code == 0, (out, err)
    assert "--auto-approve: approving send by itself" in out
    assert "approved (automatic: --auto-approve) (sent; session " in out
    assert [s["call"] for s in mesh.sent("r5")] == ["call_1_0"]


async def test_call_on_a_terminal_asks_and_sends_the_answer(mesh: Mesh) -> None:
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "call", mesh.root,
        "--input", '{"to": "tty@example.com"}', "--session-id", "r4",
        cwd=ROOT, env={**os.environ, "NO_COLOR": "1"},
        stdin=follower, stdout=follower, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(follower)
    seen = bytearray()
    deadline = time.monotonic() + CLI_TIMEOUT_S

    def read_until(marker: bytes | None) -> None:
        """Read the terminal until ``marker`` shows (``None``: until its last writer
        leaves), within the deadline: the thread never outlives the test."""
        while (marker is None or marker not in seen) and time.monotonic() < deadline:
            if not select.select([leader], [], [], 0.2)[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's last writer left
                return
            if not chunk:
                return
            seen.extend(chunk)

    try:
        await asyncio.to_thread(read_until, b"approve send? [y/N] ")
        assert b"approve send? [y/N] " in seen, seen.decode()
        assert mesh.sent("r4") == []
        os.write(leader, b"y\n")
        await asyncio.to_thread(read_until, b"reason (optional, Enter for none): ")
        os.write(leader, b"looked at it\n")
        await asyncio.to_thread(read_until, None)
        _, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(leader)
    text = seen.decode().replace("\r\n", "\n")
    assert proc.returncode == 0, (text, err.decode())
    assert "input required: send(" in text and "answer it with" not in text
    assert "call_1_0: approved (looked at it) (sent; session " in text
    assert "✓ call_1_0 approved: looked at it" in text
    assert [s["call"] for s in mesh.sent("r4")] == ["call_1_0"]


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``tree --json``'s node and every node below it."""
    return [node, *(n for child in node["children"] for n in _walk(child))]
