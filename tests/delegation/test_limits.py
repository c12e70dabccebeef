"""Deadlines and budgets down a tree of real service processes.

- A root deadline of 3 s over a child that would take 30 s: the root answers with
  what it has within 3 s plus its last model pass; the child ends interrupted.
- A token budget given to one subtree and exceeded two levels down stops that subtree
  only: its sibling and the root finish.
- That budget holds across a SIGKILL of the middle service: the resumed middle counts
  what its children used before the kill (from its log), once.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import AgentClient, SessionLimits, SessionStatus, SessionTree
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from tests.agents.limits import MIDDLE_BUDGET
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port

pytestmark = pytest.mark.timeout(180)


@asynccontextmanager
async def mesh(tmp_path: Path, *names: str) -> AsyncIterator[dict[str, ServiceProcess]]:
    """One service process per agent of ``tests.agents.limits``, each in the registry."""
    ports = {name: free_port() for name in names}
    env = {address_env_var(n): f"127.0.0.1:{p}" for n, p in ports.items()}
    services = {
        name: ServiceProcess(
            f"tests.agents.limits:{name}",
            port=ports[name],
            store_url=f"sqlite:///{tmp_path / name}.db",
            log_path=tmp_path / f"{name}.log",
            env=env,
            cwd=ROOT,
        )
        for name in names
    }
    try:
        for service in services.values():
            await service.start()
        yield services
    finally:
        for service in services.values():
            await service.stop()


async def _end(client: AgentClient, session_id: str) -> pb.StreamEvent:
    return (await _events(client, session_id))[-1]


async def _events(client: AgentClient, session_id: str) -> list[pb.StreamEvent]:
    return [e async for e in client.stream(session_id)]


async def test_a_root_deadline_ends_with_a_partial_answer_and_the_child_interrupted(
    tmp_path: Path,
) -> None:
    async with mesh(tmp_path, "hurried", "slow") as services:  # noqa: SIM117 (addresses)
        async with (
            await AgentClient.connect(services["hurried"].address) as root,
            await AgentClient.connect(services["slow"].address) as child,
        ):
            started = time.monotonic()
            await root.start("{}", session_id="root", limits=SessionLimits.within(3.0))
            end = await _end(root, "root")
            took = time.monotonic() - started
            status = await root.get_status("root")
            (child_id,) = [
                s.session_id for s in (await child.list_sessions()).sessions if s.session_id
            ]
            child_status = await child.get_status(child_id)
            tree = SessionTree()
            for event in await _events(root, "root"):
                tree.add(event)
    assert tree.root is not None and tree.root.limit_exceeded == "deadline_exceeded"
    (child_node,) = tree.root.children
    assert child_node.status is SessionStatus.INTERRUPTED
    assert child_node.limit_exceeded == "deadline_exceeded"
    assert end.WhichOneof("payload") == "completed", end
    assert end.completed.limit_exceeded == "deadline_exceeded"
    # 3 s, the grace for the children's ends (0.5 s) and one scripted model pass.
    assert took < 3.0 + 1.5, took
    answer = json.loads(end.completed.output_json)["answer"]
    assert "deadline_exceeded" in json.dumps(answer), answer
    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert status.limit_exceeded == "deadline_exceeded"
    assert status.limits.HasField("deadline")
    assert child_status.status == pb.SESSION_STATUS_INTERRUPTED
    assert child_status.limit_exceeded == "deadline_exceeded"
    assert child_status.limits.deadline.ToNanoseconds() <= status.limits.deadline.ToNanoseconds()


async def _tree_statuses(
    services: dict[str, ServiceProcess],
) -> dict[str, list[pb.GetStatusResponse]]:
    found: dict[str, list[pb.GetStatusResponse]] = {}
    for name, service in services.items():
        async with await AgentClient.connect(service.address) as client:
            listed = (await client.list_sessions()).sessions
            found[name] = [await client.get_status(s.session_id) for s in listed]
            found[name].sort(key=lambda s: s.created_at.ToNanoseconds())  # oldest first
    return found


async def test_a_budget_exceeded_two_levels_down_stops_that_subtree_only(
    tmp_path: Path,
) -> None:
    async with mesh(tmp_path, "budgeted", "middle", "leaf", "sibling") as services:
        async with await AgentClient.connect(services["budgeted"].address) as root:
            await root.start("{}", session_id="root")
            end = await _end(root, "root")
        statuses = await _tree_statuses(services)
    assert end.WhichOneof("payload") == "completed", end
    assert end.completed.limit_exceeded == ""
    answer = json.dumps(json.loads(end.completed.output_json))
    assert "sibling done" in answer and "middle stopped: budget_exceeded" in answer, answer
    (middle,) = statuses["middle"]
    assert middle.status == pb.SESSION_STATUS_INTERRUPTED
    assert middle.limit_exceeded == "budget_exceeded"
    assert middle.limits.budget_tokens <= MIDDLE_BUDGET
    leaves = statuses["leaf"]
    # Each leaf answers in one model call of ~2500 tokens: the second crosses the budget
    # it was given (what the middle had left), and the middle stops before a third.
    assert len(leaves) == 2, [s.session_id for s in leaves]
    assert leaves[1].limits.budget_tokens < MIDDLE_BUDGET - leaves[0].usage.total_tokens
    assert [s.status for s in statuses["sibling"]] == [pb.SESSION_STATUS_COMPLETED]
    # The subtree's usage passed its budget by no more than one leaf's answer.
    assert end.completed.total_usage.total_tokens > 0
    _assert_within_budget(middle, leaves)


def _assert_within_budget(middle: pb.GetStatusResponse, leaves: list[pb.GetStatusResponse]) -> None:
    leaf_most = max(s.usage.total_tokens for s in leaves)
    subtree = middle.usage.total_tokens + sum(s.usage.total_tokens for s in leaves)
    assert subtree >= MIDDLE_BUDGET, subtree
    # Over by at most the call that crossed it (a leaf's) and the middle's last step.
    assert subtree <= MIDDLE_BUDGET + leaf_most + 1000, (subtree, leaf_most)
    assert all(s.status != pb.SESSION_STATUS_RUNNING for s in leaves)


async def test_the_budget_holds_across_a_sigkill_of_the_middle_service(
    tmp_path: Path,
) -> None:
    async with mesh(tmp_path, "budgeted", "middle", "leaf", "sibling") as services:
        async with (
            await AgentClient.connect(services["budgeted"].address) as root,
            await AgentClient.connect(services["leaf"].address) as leaf,
        ):
            await root.start("{}", session_id="root")

            async def second_leaf_started() -> bool:
                # The middle checkpointed its first step (the first leaf's result) before
                # starting the second: the first leaf's usage is only in its log now.
                listed = (await leaf.list_sessions()).sessions
                done = sum(s.status == pb.SESSION_STATUS_COMPLETED for s in listed)
                return done >= 1 and len(listed) >= 2

            await assert_eventually(second_leaf_started, timeout_s=60, interval_s=0.01)
            await services["middle"].kill()  # while the second leaf works
            await services["middle"].start()
            end = await _end(root, "root")
        statuses = await _tree_statuses(services)
    assert end.WhichOneof("payload") == "completed", end
    (middle,) = statuses["middle"]
    assert middle.status == pb.SESSION_STATUS_INTERRUPTED
    assert middle.limit_exceeded == "budget_exceeded"
    # Had the resumed middle forgotten the first leaf, it would have asked a third.
    _assert_within_budget(middle, statuses["leaf"])
    assert len(statuses["leaf"]) == 2, [s.session_id for s in statuses["leaf"]]
