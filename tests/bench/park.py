"""How long a parked parent takes to get its batch after the batch's last child ended.

    .venv/bin/python -m tests.bench.park [--sessions 40] [--tasks 3] [--delay-ms 15]

A coordinator (``tests.agents.companions``) dispatches ``--tasks`` researchers with
``run_subagent``, ends its pass and parks. For each session: the delivery delay is
the parent's first ``subagent_end`` event time minus the last child's ``finished_at``
(both servers' clocks are this machine's), beside the children's own run time (from
the first ``Start`` to the last ``finished_at``) as the baseline; and the CPU this
process (the coordinator's server and the client) and the researchers' service spent
per session. The researchers'
service is a process of its own, paced by ``--delay-ms`` per streamed chunk; the
coordinator's runs in this process, unpaced, so it parks well before they end. Both
on 127.0.0.1, each with a memory store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from helix_transport import AgentClient, create_server
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents.companions import coordinator
from tests.helpers import ROOT, ServiceProcess, free_port

TOPICS = ["event sourcing", "grpc streaming", "backoff", "leases", "fencing", "replay"]


def _cpu_s(service: ServiceProcess) -> float:
    assert service.proc is not None
    fields = Path(f"/proc/{service.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _seconds(stamp: Timestamp) -> float:
    return stamp.ToNanoseconds() / 1e9


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--tasks", type=int, default=3, choices=range(1, len(TOPICS) + 1))
    parser.add_argument("--delay-ms", type=int, default=15, help="the researchers' pace")
    args = parser.parse_args()
    topics = TOPICS[: args.tasks]
    delays: list[float] = []
    children: list[float] = []
    cpus: list[float] = []
    child_cpus: list[float] = []
    workdir = Path(tempfile.mkdtemp(prefix="helix-park-"))
    child = ServiceProcess(
        "services.researcher:agent",
        port=free_port(),
        store_url="memory://",
        log_path=workdir / "researcher.log",
        env={"HELIX_SCRIPTED_DELAY_MS": str(args.delay_ms)},
        cwd=ROOT,
    )
    await child.start()
    os.environ[address_env_var("researcher")] = child.address
    try:
        async with (
            await create_server(coordinator, MemoryStore(), allow_unauthenticated=True) as parent,
            await AgentClient.connect(parent.address) as client,
            await AgentClient.connect(child.address) as child_client,
        ):
            for n in range(args.sessions + 1):  # the first is a warm-up
                session_id = f"park-{n}-{time.time_ns()}"
                cpu, child_cpu = time.process_time(), _cpu_s(child)
                await client.start(json.dumps({"topics": topics}), session_id=session_id)
                events = [e async for e in client.stream(session_id)]
                if events[-1].WhichOneof("payload") != "completed":
                    raise RuntimeError(f"{session_id}: {events[-1]}")
                ends = [e for e in events if e.WhichOneof("payload") == "subagent_end"]
                starts = [e for e in events if e.WhichOneof("payload") == "subagent_start"]
                statuses = [
                    await child_client.get_status(e.subagent_end.child_session_id) for e in ends
                ]
                last_end = max(_seconds(s.finished_at) for s in statuses)
                cpu, child_cpu = time.process_time() - cpu, _cpu_s(child) - child_cpu
                if n == 0:
                    continue
                delays.append((_seconds(ends[0].time) - last_end) * 1000)
                children.append((last_end - _seconds(starts[0].time)) * 1000)
                cpus.append(cpu * 1000)
                child_cpus.append(child_cpu * 1000)
    finally:
        await child.stop()

    def line(name: str, values: list[float]) -> str:
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return f"{name:<40} p50 {statistics.median(values):8.1f} ms   p99 {p99:8.1f} ms"

    print(f"{args.sessions} coordinator sessions, {args.tasks} researchers each, memory stores")
    print(line("children's run (baseline)", children))
    print(line("last child's end -> parent's batch", delays))
    print(f"ratio of p50s: {statistics.median(delays) / statistics.median(children):.3f}")
    print(line("CPU of this process per session", cpus))
    print(line("CPU of the researchers' service", child_cpus))


if __name__ == "__main__":
    asyncio.run(main())
