"""The official ``@a2a-js/sdk`` client (npm, ``tests/interop/a2a_js``) against a helix
service's A2A endpoint, three service processes deep (``tests.a2a.mesh``): a
three-level stream with the mailer's input-required answered on the task, SIGKILL of
the root service mid-stream then a resubscription with nothing missing, and cancel of
the tree. Needs ``node`` and ``npm ci`` there (``make node-deps``): skipped without
them on a developer's machine, failed under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.a2a.mesh import Mesh, a2a_mesh
from tests.helpers import ROOT

pytestmark = pytest.mark.asyncio(loop_scope="module")

JS_DIR = ROOT / "tests" / "interop" / "a2a_js"
TIMEOUT_S = 90.0


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        problem = "node is not installed (the A2A JS interop tests need it)"
    elif not (JS_DIR / "node_modules" / "@a2a-js" / "sdk").is_dir():
        problem = "tests/interop/a2a_js/node_modules is missing: run `make node-deps`"
    else:
        return node
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    _node()
    async with a2a_mesh(tmp_path_factory.mktemp("a2a-js-mesh")) as started:
        yield started


async def _run(*args: str) -> list[dict[str, Any]]:
    """Run the JS client to its end; its JSON lines."""
    process = await asyncio.create_subprocess_exec(
        _node(), "client.mjs", *args, cwd=JS_DIR,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(TIMEOUT_S):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines()]


def _gapless(sequences: list[int], first: int = 1) -> bool:
    return sequences == list(range(first, first + len(sequences)))


async def test_js_client_streams_three_levels_and_answers_the_mailer(mesh: Mesh) -> None:
    asked, done = await _run("delegate", mesh.url)
    assert _gapless(asked["sequences"]) and asked["depths"] == [1, 2, 3]
    assert asked["state"] == "TASK_STATE_INPUT_REQUIRED"
    (request,) = asked["data"]["input_required"]
    assert request["tool_name"] == "send_email" and len(request["path"]) == 3
    assert _gapless(done["sequences"], asked["sequences"][-1] + 1)
    assert done["state"] == done["final"] == "TASK_STATE_COMPLETED"
    assert done["output"]["result"][0]["result"][0]["sent"] is True


async def test_js_client_resubscribes_after_sigkill_with_nothing_missing(mesh: Mesh) -> None:
    process = await asyncio.create_subprocess_exec(
        _node(), "client.mjs", "start", mesh.url, cwd=JS_DIR,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    seen: list[int] = []
    async with asyncio.timeout(TIMEOUT_S):
        task_id = json.loads(await process.stdout.readline())["task"]
        while len(seen) < 15:
            seen.append(json.loads(await process.stdout.readline())["sequence"])
        await mesh.top.kill()
        await process.wait()  # its stream broke with the process
    await mesh.top.start()
    resubscribed, done = await _run("resubscribe", mesh.url, task_id)
    assert _gapless(resubscribed["sequences"]) and set(seen) <= set(resubscribed["sequences"])
    assert resubscribed["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert done["state"] == "TASK_STATE_COMPLETED"


async def test_js_client_cancels_the_tree(mesh: Mesh) -> None:
    (canceled,) = await _run("cancel", mesh.url)
    assert canceled["state"] == "TASK_STATE_CANCELED"
    _, mid_id, mailer_id = canceled["path"]
    for name, session_id in (("a2a-mid", mid_id), ("mailer", mailer_id)):
        async with await AgentClient.connect(mesh.addresses[name]) as client:
            status = await client.get_status(session_id, wait=timedelta(seconds=10))
            assert status.status == pb.SESSION_STATUS_INTERRUPTED, (name, status)
