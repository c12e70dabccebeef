"""Timing, memory and CPU probes shared by the benchmark scenarios."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.transport import AgentClient


def kind(event: pb.StreamEvent) -> str:
    """The event's payload name (``text_delta``, ``completed``, ...)."""
    return event.WhichOneof("payload") or ""


class Ids:
    """Session ids unique to this run (so shared Redis/PostgreSQL never collide)."""

    def __init__(self) -> None:
        self._n = 0
        self._run = f"{os.getpid()}-{int(time.time())}"

    def __call__(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._run}-{self._n:06d}"


async def run_session(
    client: AgentClient, input_json: str, session_id: str
) -> tuple[float, int, pb.StreamEvent]:
    """Start a session and stream it to its terminal event: (seconds, events, terminal)."""
    started = time.perf_counter()
    await client.start(input_json, session_id=session_id)
    count = 0
    last: pb.StreamEvent | None = None
    async for event in client.stream(session_id):
        count += 1
        last = event
    elapsed = time.perf_counter() - started
    if last is None:
        raise RuntimeError(f"session {session_id}: no events")
    return elapsed, count, last


@contextlib.contextmanager
def instrument_without_gc() -> Iterator[None]:
    """No garbage collection in this (the measuring) process inside a timed window.

    The bench process reads every stream of a scenario, so a full collection here
    stalls all of them at once and shows up as service latency: in scenario 6 one
    190-250 ms pause of this process's collector was the p99 of 500 sessions. Use
    only where the measured servers are other processes (their collectors stay on);
    what the window allocated is collected right after it.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def check_completed(final: pb.StreamEvent, expect_ok: int | None = None) -> dict[str, Any]:
    """The completed output; raises when the session did not complete as expected."""
    if kind(final) != "completed":
        raise RuntimeError(f"session {final.session_id} ended {kind(final)}: {final}")
    output: dict[str, Any] = json.loads(final.completed.output_json)
    if expect_ok is not None and output.get("ok") != expect_ok:
        raise RuntimeError(f"session {final.session_id}: {output}")
    return output


async def events_per_second(run: Callable[[], Awaitable[int]], repeat: int) -> float:
    """Warm up once, then the median rate over ``repeat`` timed runs of ``run``
    (which returns how many events it received)."""
    await run()
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        received = await run()
        rates.append(received / (time.perf_counter() - started))
    return statistics.median(rates)


async def latencies_ms(run: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Warm up once, then time ``count`` sequential runs of ``run``."""
    await run()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await run()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def alternating_ms(
    first: Callable[[], Awaitable[object]], second: Callable[[], Awaitable[object]], count: int
) -> tuple[list[float], list[float]]:
    """Warm up each once, then time ``count`` runs of each, alternating, so a drift
    of the host's speed hits both alike."""
    await first()
    await second()
    a: list[float] = []
    b: list[float] = []
    for _ in range(count):
        for run, samples in ((first, a), (second, b)):
            started = time.perf_counter()
            await run()
            samples.append((time.perf_counter() - started) * 1000)
    return a, b


# ---------------------------------------------------------------- memory and CPU


def proc_kib(pid: int | str, field_name: str, file: str = "status") -> int:
    """A ``kB`` field of ``/proc/PID/status`` (VmRSS, VmHWM) or ``smaps_rollup`` (Pss)."""
    with open(f"/proc/{pid}/{file}") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def memory_kib(pid: int | str) -> dict[str, int]:
    """RSS, PSS (shared pages split between their users) and USS (private pages)."""
    rollup = "smaps_rollup"
    return {
        "rss": proc_kib(pid, "VmRSS"),
        "pss": proc_kib(pid, "Pss", rollup),
        "uss": proc_kib(pid, "Private_Clean", rollup) + proc_kib(pid, "Private_Dirty", rollup),
    }


class MemoryPoller:
    """Peak RSS, PSS and USS of some processes, polled every ``interval_s`` while open."""

    def __init__(self, pids: dict[str, int | str], interval_s: float = 0.02) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.peaks = {name: {"rss": 0, "pss": 0, "uss": 0} for name in pids}
        self.peak_total_pss = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """Take one sample of every process."""
        total = 0
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                now = memory_kib(pid)
                total += now["pss"]
                peaks = self.peaks[name]
                for key, value in now.items():
                    peaks[key] = max(peaks[key], value)
        self.peak_total_pss = max(self.peak_total_pss, total)

    async def _poll(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def __enter__(self) -> MemoryPoller:
        self._task = asyncio.ensure_future(self._poll())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sample()


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU busy % of some processes over the wall time spent inside ``measure()``."""

    def __init__(self, pids: dict[str, int | str]) -> None:
        self.pids = pids
        self.cpu = dict.fromkeys(pids, 0.0)
        self.wall = 0.0

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Count CPU and wall time of the block."""
        before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        started = time.perf_counter()
        yield
        self.wall += time.perf_counter() - started
        for name, pid in self.pids.items():
            self.cpu[name] += cpu_seconds(pid) - before[name]

    def busy(self) -> dict[str, int]:
        """Percent of one CPU each process used (100 = one core flat out)."""
        if not self.wall:
            return dict.fromkeys(self.cpu, 0)
        return {name: round(100 * used / self.wall) for name, used in self.cpu.items()}
