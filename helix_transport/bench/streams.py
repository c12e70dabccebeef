"""Scenarios 1-3 (per store: 9) and 6: one stream, replay, round trip, 500 at once.

1-3 run in this process on one asyncio loop over 127.0.0.1: the helix server, the
raw ``grpc.aio`` baseline server and both clients, so both sides pay the same
in-process cost and the ratio compares like with like. 6 runs the helix service
and the raw baseline server each in its own process, the clients here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.litellm import stream_completion
from helix_transport.agent.loop import FINISH_INSTRUCTIONS
from helix_transport.bench._measure import (
    CpuMeter,
    Ids,
    check_completed,
    events_per_second,
    instrument_without_gc,
    kind,
    latencies_ms,
)
from helix_transport.bench._raw import RawCall, raw_baseline, raw_process, raw_receive
from helix_transport.bench._report import (
    Report,
    Target,
    percentile,
    ratio_at_least,
    ratio_at_most,
    summary,
    value_at_most,
)
from helix_transport.bench.agents import leaf, leaf_input
from helix_transport.bench.delegation import SERVICE_ENV
from helix_transport.config import Environment
from helix_transport.server.app import create_server
from helix_transport.store import Store, open_store
from helix_transport.testing.processes import ServiceProcess, free_port
from helix_transport.transport import AgentClient

STORES = ("memory", "sqlite", "redis", "postgres")


def store_url(name: str, tmp: Path, *, label: str = "") -> str:
    """A fresh store of backend ``name``: Redis and PostgreSQL get a throwaway namespace
    (``drop_store_data`` removes it); ``label`` tells apart stores made in one second."""
    tag = f"helix_bench_{int(time.time())}_{os.getpid()}{label}"
    redis, postgres = Environment().bench_stores()
    urls = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp / f'{tag}.db'}",
        "redis": f"{redis}?prefix={tag}",
        "postgres": f"{postgres}?schema={tag}",
    }
    return urls[name]


async def drop_store_data(name: str, url: str) -> None:
    """Remove what the benchmark wrote to a shared Redis or PostgreSQL."""
    base, _, query = url.partition("?")
    namespace = query.partition("=")[2]
    if name == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(base)
        async for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            await client.delete(key)
        await client.aclose()
    elif name == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(base)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}" CASCADE')
        await conn.close()


@asynccontextmanager
async def bench_store(name: str, tmp: Path) -> AsyncIterator[Store]:
    """A fresh store of backend ``name``, its data dropped afterwards."""
    url = store_url(name, tmp)
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.aclose()
        await drop_store_data(name, url)


# ---------------------------------------------------------------- 1-3 (and 9)


async def _beside_packed(
    report: Report,
    raw: RawCall,
    scenario: str,
    setup: str,
    helix: float,
    packed: float,
    events: int,
    repeat: int,
) -> None:
    """``helix`` (events/s) again, beside raw sending as many events per message."""
    batch = max(1, round(packed))
    base = await events_per_second(lambda: raw_receive(raw, events, batch=batch), repeat)
    report.add(
        f"{scenario}, beside raw packed alike",
        setup,
        "events/s",
        helix,
        base,
        f"raw grpc.aio, {batch} events/message (helix sent {packed:.0f})",
    )


async def single_stream(
    report: Report,
    store_name: str,
    tmp: Path,
    ids: Ids,
    *,
    events: int,
    sessions: int,
    repeat: int,
) -> None:
    """Scenarios 1, 2 and 3 on one store, each beside the raw baseline."""
    setup = f"{store_name}, in-process"
    async with (
        raw_baseline() as raw,
        bench_store(store_name, tmp) as store,
        await create_server(leaf, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        one = _OneStore(client, raw, ids, store_name=store_name, events=events)
        await _live_and_replay(report, one, server.address, setup, repeat=repeat)
        await _round_trips(report, one, setup, sessions=sessions)


@dataclass
class _OneStore:
    """What scenarios 1-3 on one store share: the client, the raw baseline, the sizes."""

    client: AgentClient
    raw: RawCall
    ids: Ids
    store_name: str
    events: int
    last: list[str] = field(default_factory=list)
    """The live sessions started, in order (scenario 2 replays the last one)."""

    async def replay(self, session_id: str) -> int:
        return sum([1 async for _ in self.client.stream(session_id, from_sequence=0)])

    def live_session(self) -> str:
        return self.ids(f"{self.store_name}-live")

    async def live(self) -> int:
        session_id = self.live_session()
        await self.client.start(leaf_input(mode="emit", n=self.events), session_id=session_id)
        self.last.append(session_id)
        return await self.replay(session_id)

    async def packing(self, address: str, session_id: str, *, live: bool = False) -> float:
        """Events per message of one read of ``session_id`` from 0 (of a new live
        session's, with ``live``), counted on the wire."""
        if live:
            await self.client.start(leaf_input(mode="emit", n=self.events), session_id=session_id)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            messages = received = 0
            async for response in stub.Stream(pb.StreamRequest(session_id=session_id)):
                if response.events:  # not a heartbeat
                    messages += 1
                    received += len(response.events)
        return received / max(messages, 1)

    async def once(self) -> None:
        session_id = self.ids(f"{self.store_name}-once")
        await self.client.start(leaf_input(), session_id=session_id)
        final: pb.StreamEvent | None = None
        async for event in self.client.stream(session_id):
            final = event
        assert final is not None
        check_completed(final)

    async def raw_events(self) -> int:
        return await raw_receive(self.raw, self.events)


async def _live_and_replay(
    report: Report, one: _OneStore, address: str, setup: str, *, repeat: int
) -> None:
    """Scenarios 1 and 2, each beside raw at 1 event/message and raw packed alike."""
    events, raw = one.events, one.raw
    # Baseline measured just before each figure, so drift hits both alike.
    base = await events_per_second(one.raw_events, repeat)
    helix = await events_per_second(one.live, repeat)
    report.add(
        f"1 live stream, {events:,} events",
        setup,
        "events/s",
        helix,
        base,
        "raw grpc.aio, 1 event/message",
        ratio_at_least(0.9),
    )
    # The target's baseline sends one event per message; helix packs the events a
    # reader is behind on (a fast emitter's, live too). Beside raw packed alike,
    # the ratio is the per-event cost alone.
    packed = await one.packing(address, one.live_session(), live=True)
    await _beside_packed(report, raw, f"1 live stream, {events:,} events", setup, helix,
                         packed, events, repeat)  # fmt: skip
    finished = one.last[-1]
    base = await events_per_second(one.raw_events, repeat)
    helix = await events_per_second(lambda: one.replay(finished), repeat)
    report.add(
        f"2 replay {events:,}-event log",
        setup,
        "events/s",
        helix,
        base,
        "raw grpc.aio, 1 event/message",
        ratio_at_least(5),
    )
    packed = await one.packing(address, finished)
    await _beside_packed(report, raw, f"2 replay {events:,}-event log", setup, helix,
                         packed, events, repeat)  # fmt: skip


async def _round_trips(report: Report, one: _OneStore, setup: str, *, sessions: int) -> None:
    """Scenario 3: Start to completed of a one-step session, beside a raw 3-message stream."""
    raw_ms = await latencies_ms(lambda: raw_receive(one.raw, 3), sessions)
    helix_ms = await latencies_ms(one.once, sessions)
    for p, target in ((50, ratio_at_most(1.5)), (99, None)):
        report.add(
            f"3 Start->completed p{p}, {sessions} sessions",
            setup,
            "ms",
            percentile(helix_ms, p),
            percentile(raw_ms, p),
            "raw grpc.aio 3-message stream",
            target,
        )
    report.details[f"3 round trip ms, {one.store_name}"] = {
        "helix": summary(helix_ms),
        "raw": summary(raw_ms),
    }
    if "3 model call ms" not in report.details:  # once per run
        # The floor under 3: the one-step agent's single litellm call on its own.
        model_ms = await latencies_ms(_model_call, sessions)
        report.add(
            f"3 of which: the litellm call alone p50, {sessions} calls",
            "no server, no store",
            "ms",
            percentile(model_ms, 50),
            percentile(raw_ms, 50),
            "raw grpc.aio 3-message stream",
        )
        report.details["3 model call ms"] = summary(model_ms)


async def _model_call() -> None:
    """One completion of the leaf's first (finishing) turn, as the run loop makes it."""
    await stream_completion(
        model=leaf.resolved_model(),
        messages=[
            {"role": "system", "content": FINISH_INSTRUCTIONS},
            {"role": "user", "content": leaf_input()},
        ],
        tools=leaf.tool_schemas(),
        on_text=lambda text: None,
    )


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
    async with raw_process(free_port()) as (stub, raw_pid):
        raw = await _raw_concurrent(
            stub, raw_pid, sessions=sessions, events=events, pace_ms=pace_ms
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
    _steady_p99(report, sessions, helix, raw, value_at_most(50))
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
) -> _Concurrent:
    latencies = _Latencies(1)
    errors: list[str] = []
    received = 0

    async def one() -> None:
        nonlocal received
        session_id = ids("conc")
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

    if warm_up:
        await one()
    latencies = _Latencies(sessions)
    received = 0
    meter = CpuMeter({"server": pid, "client": "self"})
    with instrument_without_gc():
        started = time.perf_counter()
        with meter.measure():
            await asyncio.gather(*(one() for _ in range(sessions)))
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
    )


async def _raw_concurrent(
    stub: RawCall, pid: int, *, sessions: int, events: int, pace_ms: float
) -> _Concurrent:
    latencies = _Latencies(sessions)

    async def one(stream: str) -> int:
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
            counts = await asyncio.gather(*(one(f"raw-{i}") for i in range(sessions)))
        wall = time.perf_counter() - started
    return _Concurrent(
        rate=sum(counts) / wall,
        latencies=latencies.all(),
        steady=latencies.steady(),
        streaming=latencies.streaming(),
        wall=wall,
        busy=meter.busy(),
    )
