"""Scenario 6: many sessions streaming at once through one service process.

The helix service and the raw baseline server each run in a process of their own,
the clients here. Sessions start all at once (a stress row) or with Poisson-staggered
arrivals (the target's row: by Little's law, as many stream at once on average).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench._measure import (
    CpuMeter,
    Ids,
    check_completed,
    instrument_without_gc,
    kind,
)
from helix_transport.bench._raw import RawCall, raw_process, raw_receive
from helix_transport.bench._report import Report, Target, percentile, summary, value_at_most
from helix_transport.bench.agents import leaf_input
from helix_transport.bench.delegation import SERVICE_ENV
from helix_transport.config import Environment
from helix_transport.testing.processes import ServiceProcess, free_port
from helix_transport.transport import AgentClient

# ---------------------------------------------------------------- 6


@asynccontextmanager
async def leaf_service(store_url: str, log_path: Path) -> AsyncIterator[tuple[AgentClient, int]]:
    """The bench's leaf agent served by a process of its own, as scenario 6 serves it:
    a client to it and its pid (to read its CPU)."""
    proc = ServiceProcess(
        "helix_transport.bench.agents:leaf",
        port=free_port(),
        store_url=store_url,
        log_path=log_path,
        env=SERVICE_ENV,
    )
    await proc.start(timeout_s=60)
    try:
        assert proc.proc is not None
        async with await AgentClient.connect(proc.address) as client:
            yield client, proc.proc.pid
    finally:
        await proc.stop()


@dataclass
class _Concurrent:
    rate: float
    latencies: list[float]
    """Every event's latency, ms."""
    steady: list[float]
    """Latencies of events received once every session was streaming (after the
    burst of session starts, each a model call), ms."""
    streaming: list[float]
    """Of those, the events received before the first session ended (before the burst
    of session ends, each a second model call for helix), ms."""
    wall: float
    busy: dict[str, int]
    """CPU busy % of the server process and of this (client) process."""
    timeline: dict[str, Any] = field(default_factory=dict)
    """Where in the run the latency was (see ``_Latencies.timeline``)."""
    errors: list[str] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    """With staggered arrivals: the latencies in their steady state (see
    ``_Latencies.between``), ms."""


class _Latencies:
    """Event latencies of many streams, and when the last stream got its first event."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.samples: list[tuple[float, float]] = []
        """(perf_counter at receipt, latency ms)."""
        self.started: set[str] = set()
        self.all_streaming = float("inf")
        self.first_done = float("inf")

    def add(self, stream: str, event: pb.StreamEvent) -> None:
        now = time.perf_counter()
        self.samples.append((now, (time.time_ns() - event.time.ToNanoseconds()) / 1e6))
        if stream not in self.started:
            self.started.add(stream)
            if len(self.started) == self.streams:
                self.all_streaming = now

    def done(self) -> None:
        """A stream ended."""
        self.first_done = min(self.first_done, time.perf_counter())

    def all(self) -> list[float]:
        return [ms for _, ms in self.samples] or [float("nan")]

    def steady(self) -> list[float]:
        return [ms for t, ms in self.samples if t > self.all_streaming] or [float("nan")]

    def streaming(self) -> list[float]:
        window = [ms for t, ms in self.samples if self.all_streaming < t < self.first_done]
        return window or [float("nan")]

    def between(self, started: float, arrivals: Sequence[float]) -> list[float]:
        """Latencies received between the middle arrival and the last: with twice as
        many arrivals as one session's length holds (``poisson_arrivals``), the
        sessions then stream about as many at once as the all-at-once run's."""
        if not arrivals:
            return []
        lo, hi = started + arrivals[len(arrivals) // 2], started + arrivals[-1]
        return [ms for t, ms in self.samples if lo < t < hi] or [float("nan")]

    def timeline(self, started: float, bin_s: float = 0.25) -> dict[str, Any]:
        """Latency per ``bin_s`` of receipt time since ``started`` (perf_counter), with
        when every stream had started and when the first one ended: which part of a
        run (the start burst, the streaming, the ends) a window's p99 comes from."""
        bins: dict[int, list[float]] = {}
        for at, ms in self.samples:
            bins.setdefault(int((at - started) / bin_s), []).append(ms)

        def since(at: float) -> float | None:
            return round(at - started, 3) if at != float("inf") else None

        return {
            "all_streaming_s": since(self.all_streaming),
            "first_end_s": since(self.first_done),
            "bins": [
                {
                    "from_s": round(index * bin_s, 3),
                    "events": len(window),
                    "p50_ms": round(percentile(window, 50), 2),
                    "p99_ms": round(percentile(window, 99), 2),
                }
                for index, window in sorted(bins.items())
            ],
        }


async def concurrency(
    report: Report,
    tmp: Path,
    ids: Ids,
    *,
    sessions: int,
    events: int,
    pace_ms: float,
    fewer: tuple[int, ...] = (),
) -> None:
    """Scenario 6: ``sessions`` sessions streaming at once through one service process.

    Each session's tool emits ``events`` text deltas, one every ``pace_ms``; event
    latency is receive time minus the event's own timestamp (set when it was
    emitted). Baseline: as many raw streams at once from a raw server process,
    with the same count and pacing. ``fewer`` repeats the latency figure at lighter
    loads (as many sessions each), so the table shows where one process saturates.
    """
    arrivals = poisson_arrivals(sessions, events * pace_ms / 1000)
    # HELIX_BENCH_CONCURRENCY_STORE (a store URL) runs it on another backend.
    store_url = Environment().bench_concurrency_store(f"sqlite:///{tmp / 'concurrency.db'}")
    async with leaf_service(store_url, tmp / "concurrency.log") as (client, pid):
        helix = await _helix_concurrent(
            client, ids, pid, sessions=sessions, events=events, pace_ms=pace_ms
        )
        lighter = [
            await _helix_concurrent(
                client, ids, pid, sessions=n, events=events, pace_ms=pace_ms, warm_up=False
            )
            for n in fewer
        ]
        helix_staggered = await _helix_concurrent(
            client, ids, pid, sessions=0, events=events, pace_ms=pace_ms, warm_up=False,
            arrivals=arrivals,
        )  # fmt: skip
    async with raw_process(free_port()) as (stub, raw_pid):
        raw = await _raw_concurrent(
            stub, raw_pid, sessions=sessions, events=events, pace_ms=pace_ms
        )
        raw_staggered = await _raw_concurrent(
            stub, raw_pid, sessions=0, events=events, pace_ms=pace_ms, arrivals=arrivals
        )
        raw_lighter = [
            await _raw_concurrent(stub, raw_pid, sessions=n, events=events, pace_ms=pace_ms)
            for n in fewer
        ]
    for n, helix_n, raw_n in zip(fewer, lighter, raw_lighter, strict=True):
        _steady_p99(report, n, helix_n, raw_n, None)
        report.details[f"6 concurrency, {n} sessions"] = {
            "errors": helix_n.errors,
            "offered_events_per_s": round(n * 1000 / pace_ms),
            "helix_rate": round(helix_n.rate),
            "helix_steady_latency_ms": summary(helix_n.steady),
            "raw_steady_latency_ms": summary(raw_n.steady),
            "cpu_busy_pct": {"helix": helix_n.busy, "raw": raw_n.busy},
        }
    _add_full_load(report, helix, raw, sessions=sessions, events=events, pace_ms=pace_ms)
    _add_staggered(report, helix_staggered, raw_staggered, sessions=sessions, arrivals=arrivals)


def poisson_arrivals(sessions: int, length_s: float, seed: int = 50) -> list[float]:
    """Start offsets (s) of ``2 * sessions`` sessions arriving as a Poisson process at
    ``sessions / length_s`` a second: by Little's law, ``sessions`` sessions of
    ``length_s`` each stream at once on average once the first ones end, at the
    all-at-once run's mean event rate. Seeded: every run offers the same arrivals."""
    rate = sessions / max(length_s, 1e-3)
    rng = random.Random(seed)
    at, offsets = 0.0, []
    for _ in range(2 * sessions):
        at += rng.expovariate(rate)
        offsets.append(at)
    return offsets


def _add_staggered(
    report: Report,
    helix: _Concurrent,
    raw: _Concurrent,
    *,
    sessions: int,
    arrivals: Sequence[float],
) -> None:
    """Issue 50's target 4: p99 event latency with Poisson-staggered starts."""
    rate = len(arrivals) / arrivals[-1]
    report.add(
        f"6 {sessions} sessions streaming, Poisson arrivals: p99 event latency",
        f"{_CONCURRENCY_SETUP}, {rate:.0f} starts/s, {len(arrivals)} in all",
        "ms",
        percentile(helix.window, 99),
        percentile(raw.window, 99),
        f"{len(arrivals)} raw streams arriving alike",
        value_at_most(50),
    )
    if helix.errors:
        report.notes.append(f"6 (Poisson): {len(helix.errors)} sessions failed: {helix.errors[:3]}")
    report.details["6 concurrency, Poisson arrivals"] = {
        "arrivals": len(arrivals),
        "starts_per_s": round(rate, 1),
        "errors": helix.errors,
        "helix_window_latency_ms": summary(helix.window),
        "raw_window_latency_ms": summary(raw.window),
        "helix_all_latency_ms": summary(helix.latencies),
        "cpu_busy_pct": {"helix": helix.busy, "raw": raw.busy},
        "helix_timeline": helix.timeline,
    }


_CONCURRENCY_SETUP = "sqlite, service process"


def _p99_row(
    report: Report,
    n: int,
    window: str,
    helix_ms: list[float],
    raw_ms: list[float],
    target: Target | None,
) -> None:
    report.add(
        f"6 {n} sessions at once: p99 event latency, {window}",
        _CONCURRENCY_SETUP,
        "ms",
        percentile(helix_ms, 99),
        percentile(raw_ms, 99),
        f"{n} raw streams at once",
        target,
    )


def _steady_p99(
    report: Report, n: int, helix_n: _Concurrent, raw_n: _Concurrent, target: Target | None
) -> None:
    _p99_row(report, n, "all streaming", helix_n.steady, raw_n.steady, target)
    if helix_n.errors:
        report.notes.append(f"6 ({n}): {len(helix_n.errors)} sessions failed: {helix_n.errors[:3]}")


def _add_full_load(
    report: Report,
    helix: _Concurrent,
    raw: _Concurrent,
    *,
    sessions: int,
    events: int,
    pace_ms: float,
) -> None:
    """Scenario 6's rows and details at the full load (``sessions`` at once)."""
    report.add(
        f"6 {sessions} sessions at once: aggregate",
        _CONCURRENCY_SETUP,
        "events/s",
        helix.rate,
        raw.rate,
        f"{sessions} raw streams at once",
    )
    # A stress row now: issue 50's target is on the staggered arrivals.
    _steady_p99(report, sessions, helix, raw, None)
    _p99_row(report, sessions, "before any session ends", helix.streaming, raw.streaming, None)
    _p99_row(report, sessions, "incl. the start burst", helix.latencies, raw.latencies, None)
    report.details["6 concurrency"] = {
        "sessions": sessions,
        "events_per_session": events,
        "pace_ms": pace_ms,
        "errors": helix.errors,
        "helix_latency_ms": summary(helix.latencies),
        "raw_latency_ms": summary(raw.latencies),
        "helix_steady_latency_ms": summary(helix.steady),
        "raw_steady_latency_ms": summary(raw.steady),
        "helix_streaming_latency_ms": summary(helix.streaming),
        "raw_streaming_latency_ms": summary(raw.streaming),
        "helix_wall_s": round(helix.wall, 2),
        "raw_wall_s": round(raw.wall, 2),
        "cpu_busy_pct": {"helix": helix.busy, "raw": raw.busy},
        "helix_timeline": helix.timeline,
    }


async def _helix_concurrent(
    client: AgentClient,
    ids: Ids,
    pid: int,
    *,
    sessions: int,
    events: int,
    pace_ms: float,
    warm_up: bool = True,
    arrivals: Sequence[float] = (),
) -> _Concurrent:
    """``sessions`` sessions at once, or one per offset of ``arrivals`` (seconds)."""
    latencies = _Latencies(1)
    errors: list[str] = []
    received = 0

    async def one(at: float = 0.0) -> None:
        nonlocal received
        session_id = ids("conc")
        if at:
            await asyncio.sleep(at - (time.perf_counter() - started))
        try:
            await client.start(
                leaf_input(mode="emit", n=events, pace_ms=pace_ms), session_id=session_id
            )
            final: pb.StreamEvent | None = None
            async for event in client.stream(session_id):
                if kind(event) == "text_delta":
                    received += 1
                    latencies.add(session_id, event)
                final = event
            latencies.done()
            assert final is not None
            check_completed(final)
        except Exception as exc:  # counted and reported, not fatal to the bench
            errors.append(f"{session_id}: {type(exc).__name__}: {exc}")

    started = time.perf_counter()
    if warm_up:
        await one()
    offsets = list(arrivals) or [0.0] * sessions
    sessions = len(offsets)
    latencies = _Latencies(sessions)
    received = 0
    meter = CpuMeter({"server": pid, "client": "self"})
    with instrument_without_gc():
        started = time.perf_counter()
        with meter.measure():
            await asyncio.gather(*(one(at) for at in offsets))
        wall = time.perf_counter() - started
    if received < sessions * events and not errors:
        errors.append(f"received {received} of {sessions * events} events")
    return _Concurrent(
        rate=received / wall,
        latencies=latencies.all(),
        steady=latencies.steady(),
        streaming=latencies.streaming(),
        errors=errors,
        wall=wall,
        busy=meter.busy(),
        timeline=latencies.timeline(started),
        window=latencies.between(started, arrivals),
    )


async def _raw_concurrent(
    stub: RawCall,
    pid: int,
    *,
    sessions: int,
    events: int,
    pace_ms: float,
    arrivals: Sequence[float] = (),
) -> _Concurrent:
    offsets = list(arrivals) or [0.0] * sessions
    latencies = _Latencies(len(offsets))
    started = time.perf_counter()

    async def one(stream: str, at: float) -> int:
        if at:
            await asyncio.sleep(at - (time.perf_counter() - started))
        count = await raw_receive(
            stub, events, pace_ms=pace_ms, on_event=lambda e: latencies.add(stream, e)
        )
        latencies.done()
        return count

    await raw_receive(stub, 3)
    meter = CpuMeter({"server": pid, "client": "self"})
    with instrument_without_gc():
        started = time.perf_counter()
        with meter.measure():
            counts = await asyncio.gather(*(one(f"raw-{i}", at) for i, at in enumerate(offsets)))
        wall = time.perf_counter() - started
    return _Concurrent(
        rate=sum(counts) / wall,
        latencies=latencies.all(),
        steady=latencies.steady(),
        streaming=latencies.streaming(),
        wall=wall,
        busy=meter.busy(),
        window=latencies.between(started, arrivals),
    )
