"""Where the time of a two-hop stream goes: one hop and two hops, alternating, with stages.

    python -m helix_transport.bench.two_hops [--runs 15] [--events 10000] [--store sqlite]

Starts the benchmark's leaf and parent services (``helix-mesh bench`` scenario 4's
setup), then alternates one hop (leaf -> client) and two hops (leaf -> parent ->
client) of ``--events`` text deltas. For every run it prints the wall time from
Start to the terminal event and, for two hops, when the leaf stamped its first and
last delta, when the parent stamped them (forwarded) and when this client received
them, all in ms after Start, plus the CPU of each service (``/proc``) and of this client for each run. The
medians at the end are the figures docs/performance.md quotes for two-hop changes; compare
runs of two versions of the code alternated on one host, not across hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench import delegation
from helix_transport.bench._measure import cpu_seconds
from helix_transport.bench.agents import leaf_input, parent_input
from helix_transport.registry import address_env_var


def _cpu_all(pids: dict[str, int]) -> dict[str, float]:
    return {"client": time.process_time(), **{name: cpu_seconds(pid) for name, pid in pids.items()}}


def _cpu_used(pids: dict[str, int], before: dict[str, float]) -> dict[str, float]:
    return {name: (now - before[name]) * 1000 for name, now in _cpu_all(pids).items()}


def _shown(cpu: dict[str, float]) -> str:
    return "  ".join(f"{name} {ms:.0f}" for name, ms in cpu.items())


def _stamp_ms(event: pb.StreamEvent, started: float) -> float:
    return (event.time.seconds + event.time.nanos / 1e9 - started) * 1000


async def _one_hop(client: AgentClient, session_id: str, events: int) -> dict[str, float]:
    started = time.time()
    await client.start(leaf_input(mode="emit", n=events), session_id=session_id)
    received: list[tuple[float, pb.StreamEvent]] = []
    async for event in client.stream(session_id):
        received.append((time.time(), event))
    total = (time.time() - started) * 1000
    deltas = [(at, event) for at, event in received if event.WhichOneof("payload") == "text_delta"]
    (_, first), (last_at, last) = deltas[0], deltas[-1]
    return {
        "total": total,
        "leaf first": _stamp_ms(first, started),
        "leaf last": _stamp_ms(last, started),
        "received last": (last_at - started) * 1000,
    }


async def _two_hops(client: AgentClient, session_id: str, events: int) -> dict[str, float]:
    started = time.time()
    await client.start(parent_input("child", mode="emit", n=events), session_id=session_id)
    received: list[tuple[float, pb.StreamEvent]] = []
    async for event in client.stream(session_id):
        received.append((time.time(), event))
    total = (time.time() - started) * 1000
    deltas = [
        (at, event)
        for at, event in received
        if event.WhichOneof("payload") == "child_event"
        and event.child_event.event.WhichOneof("payload") == "text_delta"
    ]
    if len(deltas) != events:
        raise RuntimeError(f"{len(deltas)} of {events} deltas arrived")
    (first_at, first), (last_at, last) = deltas[0], deltas[-1]
    return {
        "total": total,
        "leaf first": _stamp_ms(first.child_event.event, started),
        "leaf last": _stamp_ms(last.child_event.event, started),
        "parent first": _stamp_ms(first, started),
        "parent last": _stamp_ms(last, started),
        "received first": (first_at - started) * 1000,
        "received last": (last_at - started) * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="helix-two-hops-") as tmp:
        services = delegation.Services(Path(tmp))
        if args.store == "sqlite":
            delegation.chain(services)
        else:
            leaf_proc = services.add("leaf", "leaf", store_url="memory://")
            services.add(
                "parent",
                "parent",
                store_url="memory://",
                env={address_env_var("bench-leaf"): leaf_proc.address},
            )
        await services.start("leaf", "parent")
        # As `helix-mesh bench` does: this process imported litellm too, and a full
        # collection of it (~75 ms) would land in the middle of some run.
        gc.collect()
        gc.freeze()
        pids = {name: services.pid(name) for name in ("leaf", "parent")}
        one: list[dict[str, float]] = []
        two: list[dict[str, float]] = []
        try:
            async with (
                await AgentClient.connect(services.procs["leaf"].address) as leaf,
                await AgentClient.connect(services.procs["parent"].address) as parent,
            ):
                await _one_hop(leaf, "warm-1", args.events)
                await _two_hops(parent, "warm-2", args.events)
                for run in range(args.runs):
                    cpu = _cpu_all(pids)
                    one.append(await _one_hop(leaf, f"one-{run}", args.events))
                    one_cpu = _cpu_used(pids, cpu)
                    one_shown = "  ".join(f"{k} {v:.1f}" for k, v in one[-1].items())
                    cpu = _cpu_all(pids)
                    stages = await _two_hops(parent, f"two-{run}", args.events)
                    used = _cpu_used(pids, cpu)
                    two.append(stages)
                    shown = "  ".join(f"{k} {v:.1f}" for k, v in stages.items())
                    print(
                        f"one hop {one_shown} (CPU ms {_shown(one_cpu)})\n  two hops {shown}"
                        f" | CPU ms {_shown(used)}"
                    )
        finally:
            await services.stop()
    one_total = statistics.median(s["total"] for s in one)
    two_total = statistics.median(s["total"] for s in two)
    print(
        f"median of {args.runs}: one hop {one_total:.1f} ms, two hops "
        f"{two_total:.1f} ms, ratio {one_total / two_total:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
