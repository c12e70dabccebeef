"""Crash recovery with real processes: SIGKILL mid-run, restart, resume from the checkpoint.

The reader keeps one ``EventStream`` open across the crash: the transport
reconnects from its last sequence, so the log it delivers must be gapless and
duplicate-free, and the model calls logged by the scripted provider prove that
steps finished before the crash did not run again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.helpers import ROOT, ServiceProcess, free_port


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def _service(
    workdir: Path, *, port: int, replica: str = "", lease_ttl: float = 1.0
) -> ServiceProcess:
    args = ["--lease-ttl", str(lease_ttl), "--drain-timeout", "0.5"]
    service = ServiceProcess(
        "tests.agents:counter",
        port=port,
        store_url=f"sqlite:///{workdir / 'helix.db'}",
        log_path=workdir / "server.log",
        env={
            "HELIX_SCRIPTED_DELAY_MS": "15",
            "HELIX_SCRIPTED_CALL_LOG": str(workdir / "calls.log"),
        },
        extra_args=args,
        cwd=ROOT,
    )
    if replica:
        service.extra_args += ["--replica-id", replica]
    return service


def _model_calls(workdir: Path, session_id: str) -> int:
    lines = (workdir / "calls.log").read_text().splitlines()
    return sum(1 for line in lines if line.split() == ["counter", session_id])


@pytest.mark.parametrize("same_replica", [True, False], ids=["restart", "new-replica"])
async def test_sigkill_mid_run_resumes_with_a_gapless_stream(
    workdir: Path, same_replica: bool
) -> None:
    port = free_port()
    first = _service(workdir, port=port, replica="" if same_replica else "first")
    await first.start()
    second = _service(workdir, port=port, replica="" if same_replica else "second")
    steps = 6
    try:
        async with await AgentClient.connect(first.address) as client:
            await client.start(json.dumps({"steps": steps, "words": 6}), session_id="crash")
            stream = client.stream("crash")
            events: list[pb.StreamEvent] = []
            crashed = False
            async for event in stream:
                events.append(event)
                # Once: the resumed run may announce step 3 again.
                if (
                    not crashed
                    and event.WhichOneof("payload") == "step_started"
                    and event.step == 3
                ):
                    crashed = True
                    await first.kill()  # mid-run: step 3's model call is streaming
                    await second.start()
            status = await client.get_status("crash")
    finally:
        await first.stop()
        await second.stop()

    sequences = [e.sequence for e in events]
    assert sequences == list(range(1, len(events) + 1)), "gap or duplicate across the crash"
    payloads = [e.WhichOneof("payload") for e in events]
    assert payloads.count("run_started") == 1
    resumed = [e.run_resumed for e in events if e.WhichOneof("payload") == "run_resumed"]
    assert len(resumed) == 1 and resumed[0].step in (3, 4)
    assert payloads[-1] == "completed"
    assert json.loads(events[-1].completed.output_json) == {"total": steps, "steps": steps}
    assert status.status == pb.SESSION_STATUS_COMPLETED and status.last_sequence == sequences[-1]
    assert stream.reconnects >= 1
    # steps + the finish step; at most the one cut-off model call runs again.
    assert steps + 1 <= _model_calls(workdir, "crash") <= steps + 2


async def test_sigterm_drains_then_a_restart_resumes(workdir: Path) -> None:
    port = free_port()
    service = _service(workdir, port=port)
    await service.start()
    try:
        async with await AgentClient.connect(service.address) as client:
            await client.start(json.dumps({"steps": 12, "words": 8}), session_id="drain")
            stream = client.stream("drain")
            events: list[pb.StreamEvent] = []
            drained = False
            async for event in stream:
                events.append(event)
                if (
                    not drained
                    and event.WhichOneof("payload") == "step_started"
                    and event.step == 2
                ):
                    drained = True
                    # Drain timeout is 0.5s and the run needs far longer: it is checkpointed.
                    assert await service.terminate() == 0
                    status_path = workdir / "server.log"
                    assert "Traceback" not in status_path.read_text()
                    await service.start()
            status = await client.get_status("drain")
    finally:
        await service.stop()

    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert [e.WhichOneof("payload") for e in events].count("run_resumed") == 1
