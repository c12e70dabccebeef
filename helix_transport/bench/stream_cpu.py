"""A service's CPU per streamed event, with many sessions streaming at once.

    python -m helix_transport.bench.stream_cpu [--sessions 300] [--events 300]
        [--pace-ms 50] [--window-s 8] [--runs 3] [--store sqlite]

Scenario 6 of ``helix-mesh bench`` reports latency, which on a saturated process
is mostly queueing: it moves a lot with the host and little with the code. This
measures what the code controls: the leaf service's CPU (``/proc``) per event it
streams, in a window when every session is streaming and none has ended (no
model calls, no starts: only the per-event path: the tool's emit, the store
append, the fan-out to the reader, the gRPC write). It also prints the event
latency in that window and the CPU of this client, which reads every stream.
Compare two versions of the code on one host, alternating runs, not across hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench._measure import cpu_seconds, instrument_without_gc
from helix_transport.bench._raw import RawCall, raw_process, raw_receive
from helix_transport.bench._report import percentile
from helix_transport.bench.agents import leaf_input
from helix_transport.bench.concurrency import leaf_service
from helix_transport.testing.processes import free_port

Receive = Callable[[int, Callable[[pb.StreamEvent], None]], Coroutine[Any, Any, None]]
"""Stream session ``index`` to its end, calling back with each text delta."""


def _helix(client: AgentClient, *, events: int, pace_ms: float) -> Receive:
    async def receive(index: int, on_delta: Callable[[pb.StreamEvent], None]) -> None:
        session_id = f"cpu-{time.monotonic_ns()}-{index}"
        await client.start(
            leaf_input(mode="emit", n=events, pace_ms=pace_ms), session_id=session_id
        )
        async for event in client.stream(session_id):
            if event.WhichOneof("payload") == "text_delta":
                on_delta(event)

    return receive


def _raw(stub: RawCall, *, events: int, pace_ms: float) -> Receive:
    async def receive(index: int, on_delta: Callable[[pb.StreamEvent], None]) -> None:
        await raw_receive(stub, events, pace_ms=pace_ms, on_event=on_delta)

    return receive


async def _run(
    receive: Receive, pid: int, *, sessions: int, window_s: float, warn: bool = True
) -> dict[str, float]:
    received = 0
    streaming: set[int] = set()
    latencies: list[float] = []
    measuring = False
    all_streaming = asyncio.Event()

    def on_delta(index: int, event: pb.StreamEvent) -> None:
        nonlocal received
        if index not in streaming:
            streaming.add(index)
            if len(streaming) == sessions:
                all_streaming.set()
        if measuring:
            received += 1
            latencies.append((time.time_ns() - event.time.ToNanoseconds()) / 1e6)

    tasks = [
        asyncio.create_task(receive(i, functools.partial(on_delta, i))) for i in range(sessions)
    ]
    await all_streaming.wait()
    await asyncio.sleep(0.5)  # past the burst of first model calls
    cpu0, client0, wall0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    measuring = True
    await asyncio.sleep(window_s)
    measuring = False
    cpu1, client1, wall1 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    ended_inside = any(task.done() for task in tasks)
    await asyncio.gather(*tasks)
    if ended_inside and warn:
        print("warning: sessions ended inside the window; raise --events")
    wall = wall1 - wall0
    latencies = latencies if len(latencies) > 1 else [float("nan")] * 2
    return {
        "events/s": received / wall,
        "server us/event": (cpu1 - cpu0) * 1e6 / max(received, 1),
        "server busy %": 100 * (cpu1 - cpu0) / wall,
        "client us/event": (client1 - client0) * 1e6 / max(received, 1),
        "p50 ms": percentile(latencies, 50),
        "p99 ms": percentile(latencies, 99),
    }


async def _runs(
    name: str, receive: Receive, pid: int, args: argparse.Namespace
) -> dict[str, float]:
    rows = []
    for _ in range(args.runs):
        with instrument_without_gc():
            row = await _run(receive, pid, sessions=args.sessions, window_s=args.window_s)
        rows.append(row)
        print(f"{name:6s} " + _shown(row), flush=True)
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def _shown(row: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:,.1f}" for k, v in row.items())


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--pace-ms", type=float, default=50)
    parser.add_argument("--window-s", type=float, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", default="sqlite", help="sqlite or a store URL")
    args = parser.parse_args()
    gc.freeze()  # as helix-mesh bench does: the client's collections are not the service's
    with tempfile.TemporaryDirectory(prefix="helix-stream-cpu-") as tmp:
        store = f"sqlite:///{Path(tmp) / 'leaf.db'}" if args.store == "sqlite" else args.store
        async with leaf_service(store, Path(tmp) / "leaf.log") as (client, pid):
            warm = _helix(client, events=30, pace_ms=5)
            await _run(warm, pid, sessions=10, window_s=0.01, warn=False)
            helix = await _runs(
                "helix", _helix(client, events=args.events, pace_ms=args.pace_ms), pid, args
            )
    async with raw_process(free_port()) as (stub, raw_pid):
        raw = await _runs(
            "raw", _raw(stub, events=args.events, pace_ms=args.pace_ms), raw_pid, args
        )
    print(f"median of {args.runs}, helix: {_shown(helix)}")
    print(f"median of {args.runs}, raw:   {_shown(raw)}")
    print(
        f"server CPU per event, helix / raw: {helix['server us/event'] / raw['server us/event']:.2f}x"
    )


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    asyncio.run(main())
