"""Requests for input across real service processes, answered at the root: two requests
pending at once in sibling children (answered in either order), and a client tool inside
a ``run_subagent`` task. Each service runs in its own process with its own SQLite store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.helpers import ROOT, ServiceProcess, free_port
from tests.inputs.test_tree import requests_until_suspended

AGENTS = {  # children first: their addresses go to their parents
    "hitl-mailer": "mailer",
    "hitl-picker": "picker",
    "hitl-fanout": "fanout",
    "hitl-dispatcher": "dispatcher",
}


pytestmark = pytest.mark.asyncio(loop_scope="module")  # one set of processes for all


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, str]]:
    workdir: Path = tmp_path_factory.mktemp("hitl-processes")
    env: dict[str, str] = {"HELIX_SCRIPTED_DELAY_MS": "5"}
    processes: list[ServiceProcess] = []
    addresses: dict[str, str] = {}
    for agent_type, attribute in AGENTS.items():
        process = ServiceProcess(
            f"tests.agents.approvals:{attribute}",
            port=free_port(),
            store_url=f"sqlite:///{workdir / (agent_type + '.db')}",
            log_path=workdir / f"{agent_type}.log",
            env=dict(env),
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )
        processes.append(process)
        addresses[agent_type] = process.address
        env[f"HELIX_AGENT_ADDRESS_{agent_type.upper().replace('-', '_')}"] = process.address
    await asyncio.gather(*(p.start() for p in processes))
    yield addresses
    await asyncio.gather(*(p.stop() for p in processes))


@pytest.mark.parametrize("order", ["a-first", "b-first"])
async def test_sibling_requests_in_two_child_processes(
    services: dict[str, str], order: str
) -> None:
    session_id = f"siblings-{order}"
    async with await AgentClient.connect(services["hitl-fanout"]) as client:
        await client.start("{}", session_id=session_id)
        requests, _ = await requests_until_suspended(client, session_id, count=2)
        by_call = {("a" if "-remote-call_a-" in r.path[-1] else "b"): r for r in requests}
        first, second = (by_call["a"], by_call["b"])
        if order == "b-first":
            first, second = second, first
        await client.submit_input(session_id, first.request_id, path=first.path, approved=True)
        # The answered child finishes; its parent goes on waiting for the other.
        status = await client.get_status(session_id, wait=timedelta(seconds=2))
        assert status.status != pb.SESSION_STATUS_COMPLETED
        await client.submit_input(session_id, second.request_id, path=second.path, approved=True)
        status = await client.get_status(session_id, wait=timedelta(seconds=30))
        assert status.status == pb.SESSION_STATUS_COMPLETED, status
        sent = [r["result"][0] for r in json.loads(status.output_json)["result"]]
        assert sent == [{"sent_to": "a@example.com"}, {"sent_to": "b@example.com"}]


async def test_a_client_tool_inside_a_run_subagent_task(services: dict[str, str]) -> None:
    async with await AgentClient.connect(services["hitl-dispatcher"]) as client:
        await client.start('{"colors": ["red", "green"]}', session_id="task-pick")
        (request,), _ = await requests_until_suspended(client, "task-pick")
        assert request.kind == pb.INPUT_KIND_CLIENT_RESULT and request.path[0] == "task-pick"
        await client.submit_input(
            "task-pick", request.request_id, path=request.path, result_json='"green"'
        )
        status = await client.get_status("task-pick", wait=timedelta(seconds=30))
        assert status.status == pb.SESSION_STATUS_COMPLETED, status
        assert "green" in status.output_json
