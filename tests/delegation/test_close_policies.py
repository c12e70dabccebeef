"""A parent's end is its children's end, by the policy it declared (real processes).

A parent dispatches a task (a ``holder``, running until the test lets it finish) and calls ``__finish__`` at once, while the task
is out; its service is SIGKILLed at that moment (the parent hangs in a finish hook
until the test kills it) and restarted, and the resumed run finishes again:

- ``TERMINATE``: the parent completes and the task is interrupted (through the outbox);
- ``WAIT``: the finish is held until the task completes, its result goes to the
  parent for one more pass, and that pass's output carries it;
- ``ABANDON``: the parent completes and the task runs on to its own end.

Each parent's log has one ``close_policy_applied`` per task saying what was done, and
no task of a terminate or wait parent is left RUNNING.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.registry import address_env_var
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port


@asynccontextmanager
async def mesh(parent: str, workdir: Path) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    def service(agent: str, name: str, env: dict[str, str]) -> ServiceProcess:
        return ServiceProcess(
            agent,
            port=free_port(),
            store_url=f"sqlite:///{workdir / (name + '.db')}",
            log_path=workdir / f"{name}.log",
            env=env,
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )

    child = service("tests.agents.closing:holder", "holder", {})
    parent_service = service(
        f"tests.agents.closing:{parent}",
        parent,
        {
            address_env_var("holder"): child.address,
            "HELIX_TEST_FINISH_MARK": str(workdir / "finishing"),
        },
    )
    await asyncio.gather(child.start(), parent_service.start())
    try:
        yield child, parent_service
    finally:
        await asyncio.gather(parent_service.stop(), child.stop())


async def _finish_killed(
    parent: ServiceProcess, workdir: Path, session_id: str
) -> list[pb.StreamEvent]:
    """Start ``session_id``, SIGKILL its service as it finishes, restart it; its log."""
    mark = workdir / "finishing"
    async with await AgentClient.connect(parent.address) as client:
        go = str(workdir / "go")
        await client.start(json.dumps({"topics": [go]}), session_id=session_id)

    async def finishing() -> bool:
        return mark.exists()

    await assert_eventually(finishing, timeout_s=60)
    await parent.kill()
    (workdir / "finishing.done").write_text("")
    await parent.start()
    if parent.agent.endswith(":waiting"):
        await asyncio.sleep(2)  # the resumed parent holds its finish meanwhile
        (workdir / "go").write_text("")
    async with await AgentClient.connect(parent.address) as client:
        retry = client.config.reconnect.until_cancelled()
        async with asyncio.timeout(90):
            return [e async for e in client.stream(session_id, retry=retry)]


def _applied(events: list[pb.StreamEvent]) -> list[pb.ClosePolicyApplied]:
    return [e.close_policy_applied for e in events if e.HasField("close_policy_applied")]


@pytest.mark.parametrize(
    ("parent", "action", "child_end"),
    [
        ("terminating", pb.CLOSE_ACTION_TERMINATED, pb.SESSION_STATUS_INTERRUPTED),
        ("waiting", pb.CLOSE_ACTION_WAITED, pb.SESSION_STATUS_COMPLETED),
        ("abandoning", pb.CLOSE_ACTION_ABANDONED, pb.SESSION_STATUS_COMPLETED),
    ],
)
async def test_a_parent_killed_as_it_finishes_with_a_task_out_follows_its_policy(
    parent: str, action: int, child_end: int, tmp_path: Path
) -> None:
    task = f"p-task-call_1_0-0-{child_scope(parent, '')}"
    async with mesh(parent, tmp_path) as (child, parent_service):
        events = await _finish_killed(parent_service, tmp_path, "p")
        async with await AgentClient.connect(child.address) as children:
            running = await children.get_status(task)
            if parent == "abandoning":
                (tmp_path / "go").write_text("")  # left running: it may finish now
            async with asyncio.timeout(60):
                ended = await children.wait(task)

    assert events[-1].HasField("completed"), events[-1]
    assert "run_resumed" in [e.WhichOneof("payload") for e in events]
    [applied] = _applied(events)
    assert (applied.child_session_id, applied.action) == (task, action)
    assert ended.status == child_end
    held = json.loads(events[-1].completed.output_json)["held"]
    if parent == "waiting":
        # Held until the task ended; its result went to the parent's last pass.
        assert [r["status"] for r in held] == ["completed"]
        assert held[0]["output"]["held"] == str(tmp_path / "go")
        assert running.status == pb.SESSION_STATUS_COMPLETED
    else:
        assert held == []
    if parent == "abandoning":
        # Left to run on: still running once its parent had completed.
        assert running.status == pb.SESSION_STATUS_RUNNING
