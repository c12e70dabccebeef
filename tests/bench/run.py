"""helix-mesh benchmark: event throughput and round-trip latency against raw grpc.aio.

Run ``.venv/bin/python tests/bench/run.py [--events 10000] [--sessions 500] [--json]``.

Everything runs in this process on one asyncio loop over 127.0.0.1: the helix
server, the raw grpc.aio baseline server and both clients. Both sides pay the same
in-process cost (client and server share one core's worth of Python), so the
ratio compares like with like; absolute figures are lower than with a separate
client process. Every helix figure sits beside a raw baseline measured just
before it; every measurement is warmed up once, then an events/s figure is the
median of ``--repeat`` timed runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before anything imports litellm
# Run as a script, sys.path[0] is tests/bench; put the repository root first so the
# working tree's helix_transport is imported (the venv's editable finder maps it as a
# namespace package, which hides the package's __init__ exports).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import asyncio
import json
import logging
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeAlias

import grpc
from pydantic import BaseModel

from helix_transport import Agent, AgentClient, ClientConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
    user_input,
)
from helix_transport.store import Store, open_store
from tests.bench.agents import emit_events  # the same event-emitting tool as the delegation bench

# ---------------------------------------------------------------- the bench agent


class BenchInput(BaseModel):
    mode: str
    """``emit`` (a tool emits n events), ``text`` (the model streams n words) or ``once``."""
    n: int = 0


class BenchOutput(BaseModel):
    events: int


def bench_script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    request = BenchInput.model_validate(user_input(messages))
    if steps_taken(messages) > 0 or request.mode == "once":
        return finish(events=request.n)
    if request.mode == "emit":
        return ScriptedTurn(tool_calls=(call("emit_events", n=request.n),))
    # "text": n word-sized chunks through litellm's streaming path, then finish.
    return ScriptedTurn(text="w " * request.n, tool_calls=finish(events=request.n).tool_calls)


AGENT = Agent(
    name="bench",
    description="Produces events for the benchmark.",
    input_model=BenchInput,
    output_model=BenchOutput,
    tools=[emit_events],
    model=register_script("bench", bench_script),
)

# ---------------------------------------------------------------- the raw baseline

RAW_SERVICE = "bench.Raw"
RAW_METHOD = f"/{RAW_SERVICE}/Stream"


async def raw_stream(
    request: pb.StreamRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[pb.StreamResponse]:
    """Send ``from_sequence`` messages, each one event shaped like a helix text delta."""
    event = pb.StreamEvent(
        session_id=request.session_id,
        agent_type=AGENT.name,
        step=2,
        text_delta=pb.TextDelta(text="x"),
    )
    for sequence in range(1, request.from_sequence + 1):
        event.sequence = sequence
        event.time.FromNanoseconds(time.time_ns())
        yield pb.StreamResponse(events=[event])


async def start_raw_server() -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        raw_stream,
        request_deserializer=pb.StreamRequest.FromString,
        response_serializer=pb.StreamResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(RAW_SERVICE, {"Stream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


RawCall: TypeAlias = "grpc.aio.UnaryStreamMultiCallable[Any, pb.StreamResponse]"


async def raw_receive(stream: RawCall, messages: int) -> int:
    """Events received from one raw RPC sending ``messages`` messages."""
    count = 0
    async for response in stream(
        pb.StreamRequest(session_id="raw-session-0001", from_sequence=messages)
    ):
        count += len(response.events)
    return count


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True, kw_only=True)
class Row:
    scenario: str
    store: str
    unit: str
    helix: float
    raw: float
    ratio: float
    """helix / raw: below 1 is slower for events/s, above 1 is slower for ms."""


async def events_per_second(run: Callable[[], Awaitable[int]], repeat: int) -> float:
    """Warm up once, then the median rate over ``repeat`` timed runs of ``run``.

    ``run`` returns how many events it received.
    """
    await run()
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        received = await run()
        rates.append(received / (time.perf_counter() - started))
    return statistics.median(rates)


async def latencies_ms(run: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Warm up once, then time ``count`` sequential runs."""
    await run()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await run()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(samples: list[float], p: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


class Bench:
    """One store's helix server and client, plus the shared raw baseline stub."""

    def __init__(
        self, client: AgentClient, raw: RawCall, store_name: str, *, events: int, repeat: int
    ) -> None:
        self.client = client
        self.raw = raw
        self.store_name = store_name
        self.events = events
        self.repeat = repeat
        self._sessions = 0

    async def session(self, mode: str, n: int = 0) -> tuple[str, int]:
        """Start a session and stream it to its terminal event: (session id, events seen)."""
        self._sessions += 1
        session_id = f"{self.store_name}-{mode}-{self._sessions:05d}"
        await self.client.start(BenchInput(mode=mode, n=n).model_dump_json(), session_id=session_id)
        return session_id, await self.replay(session_id)

    async def replay(self, session_id: str) -> int:
        return sum([1 async for _ in self.client.stream(session_id, from_sequence=0)])

    async def throughput_row(self, scenario: str, run: Callable[[], Awaitable[int]]) -> Row:
        raw = await events_per_second(lambda: raw_receive(self.raw, self.events), self.repeat)
        helix = await events_per_second(run, self.repeat)
        return Row(
            scenario=scenario,
            store=self.store_name,
            unit="events/s",
            helix=helix,
            raw=raw,
            ratio=helix / raw,
        )

    async def rows(self, sessions: int) -> list[Row]:
        n = self.events
        last: list[str] = []

        async def live() -> int:
            session_id, received = await self.session("emit", n)
            last.append(session_id)
            return received

        rows = [await self.throughput_row(f"1 live stream, {n:,} events", live)]
        finished = last[-1]
        rows.append(
            await self.throughput_row(f"2 replay {n:,}-event log", lambda: self.replay(finished))
        )
        rows.append(
            await self.throughput_row(
                f"3 via litellm, {n:,} deltas", lambda: self._received(self.session("text", n))
            )
        )
        raw = await latencies_ms(lambda: raw_receive(self.raw, 3), sessions)
        helix = await latencies_ms(lambda: self.session("once"), sessions)
        for p in (50, 99):
            h, r = percentile(helix, p), percentile(raw, p)
            scenario = f"4 round trip p{p} ({sessions} sessions)"
            rows.append(
                Row(
                    scenario=scenario, store=self.store_name, unit="ms", helix=h, raw=r, ratio=h / r
                )
            )
        return rows

    @staticmethod
    async def _received(session: Awaitable[tuple[str, int]]) -> int:
        return (await session)[1]


async def bench_store(
    store_name: str, store: Store, raw: RawCall, args: argparse.Namespace
) -> list[Row]:
    try:
        server = await create_server(AGENT, store, allow_unauthenticated=True)
        async with server, await AgentClient.connect(server.address) as client:
            return await Bench(
                client, raw, store_name, events=args.events, repeat=args.repeat
            ).rows(args.sessions)
    finally:
        await store.aclose()


async def run_all(args: argparse.Namespace) -> list[Row]:
    raw_server, port = await start_raw_server()
    options = ClientConfig.default.channel_options()  # the same channel options as AgentClient
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            raw: RawCall = channel.unary_stream(
                RAW_METHOD,
                request_serializer=pb.StreamRequest.SerializeToString,
                response_deserializer=pb.StreamResponse.FromString,
            )
            rows: list[Row] = []
            with tempfile.TemporaryDirectory(prefix="helix-bench-") as tmp:
                for name in args.stores.split(","):
                    store, url = await open_bench_store(name, Path(tmp))
                    try:
                        rows += await bench_store(name, store, raw, args)
                    finally:
                        await store.aclose()
                        await drop_bench_data(name, url)
            return rows
    finally:
        await raw_server.stop(None)


async def open_bench_store(name: str, tmp: Path) -> tuple[Store, str]:
    """A fresh store of backend ``name`` and its URL; Redis and PostgreSQL get a throwaway
    namespace (``drop_bench_data`` removes it)."""
    tag = f"helix_bench_{int(time.time())}_{os.getpid()}"
    urls = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp / 'bench.db'}",
        "redis": f"{os.environ.get('HELIX_BENCH_REDIS_URL', 'redis://127.0.0.1:6379/0')}?prefix={tag}",
        "postgres": os.environ.get(
            "HELIX_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
        )
        + f"?schema={tag}",
    }
    if name not in urls:
        raise SystemExit(f"unknown store {name!r}: choose from {', '.join(urls)}")
    return await open_store(urls[name]), urls[name]


async def drop_bench_data(name: str, url: str) -> None:
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


# ---------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "grpcio": grpc.__version__,
        "setup": "in-process: servers and clients on one asyncio loop, 127.0.0.1",
    }


def fmt(value: float, unit: str) -> str:
    return f"{value:,.0f} ev/s" if unit == "events/s" else f"{value:,.2f} ms"


def print_table(rows: list[Row], args: argparse.Namespace, elapsed_s: float) -> None:
    info = machine()
    print(f"helix-mesh bench: {info['cpu_count']} CPUs, {info['python']}, grpcio {info['grpcio']}")
    print(info["setup"])
    print(
        f"events={args.events:,}, sessions={args.sessions}; "
        f"ev/s = median of {args.repeat} timed runs after one warm-up"
    )
    print()
    header = ("scenario", "store", "helix", "raw grpc.aio", "helix/raw")
    table = [header] + [
        (r.scenario, r.store, fmt(r.helix, r.unit), fmt(r.raw, r.unit), f"{r.ratio:.2f}x")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for i, line in enumerate(table):
        cells = [
            c.ljust(w) if j < 2 else c.rjust(w)
            for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print("helix/raw: for ev/s below 1x is slower than raw; for ms above 1x is slower.")
    print("The raw stream sends one event per message; helix packs consecutive events into")
    print("one message when its reader is behind (always on replay), so it can beat that rate.")
    print(f"total {elapsed_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stores",
        default="memory,sqlite",
        help="comma-separated backends: memory (the baseline), sqlite, redis, postgres",
    )
    parser.add_argument(
        "--events", type=int, default=10_000, help="events per stream (default 10000)"
    )
    parser.add_argument(
        "--sessions", type=int, default=500, help="round-trip sessions (default 500)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs per ev/s figure, median shown (3)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON document instead of a table"
    )
    args = parser.parse_args()
    if args.events < 1 or args.sessions < 2 or args.repeat < 1:
        parser.error("need --events >= 1, --sessions >= 2 and --repeat >= 1")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)

    started = time.perf_counter()
    rows = asyncio.run(run_all(args))
    elapsed = time.perf_counter() - started
    if args.json:
        document = {
            "machine": machine(),
            "params": {"events": args.events, "sessions": args.sessions, "repeat": args.repeat},
            "elapsed_s": round(elapsed, 2),
            "rows": [asdict(r) for r in rows],
        }
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print_table(rows, args, elapsed)


if __name__ == "__main__":
    main()
