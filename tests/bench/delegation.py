"""helix-mesh delegation benchmark: what a remote sub-agent costs, each figure beside a
baseline measured in the same run.

Run ``.venv/bin/python tests/bench/delegation.py [--json] [--children 200] [--repeat N]``.

Scenarios (agents in ``tests/bench/agents.py`` and ``tests/agents.py``):

1. Delegation overhead: ``bench-parent`` delegating to a one-step ``bench-leaf`` child
   (its scripted model finishes on the first turn), Start -> ``completed`` of the
   parent, ``--sessions`` sequential sessions, p50/p99. Baseline: the same parent
   calling the ``local`` tool, which runs the leaf's work (its scripted model turn
   through litellm and its output validation) directly inside the parent's tool call:
   no child session, no child log, no gRPC. Measured twice: with parent and child as
   separate ``helix-mesh serve`` processes on SQLite, and with both servers in this
   process on one loop (memory stores, loopback gRPC).
2. Two hops vs one hop: a leaf whose tool emits ``--events`` text deltas, streamed
   by this client straight from the leaf service (baseline, one hop), and through a
   parent that delegates to it (leaf -> parent -> client, two hops). Separate
   processes, SQLite. events/s = events the client received / (Start -> terminal).
3. Fan-out: one parent delegating to ``--children`` one-step leaves in one step
   (separate processes, SQLite). Wall time Start -> ``completed`` beside the same
   number of leaf sessions started and streamed concurrently by this client directly
   (no parent); peak RSS (VmRSS polled every 10 ms during the fan-out runs) of the
   parent service, the leaf service and this client, beside their idle RSS just before.
4. Interrupt latency, three levels: ``delegator -> middle -> counter`` (tests.agents)
   as separate processes on SQLite, the leaf counting 50 steps with
   ``HELIX_SCRIPTED_DELAY_MS=5``. Once the leaf has run a step, ``Interrupt`` the
   root; time until GetStatus reports ``interrupted`` for all three (each polled
   every 2 ms, polls start with the RPC). Baseline: a counter session interrupted
   directly on the counter service (one level). The polls are not free: each is a
   read on the service's one SQLite thread, queued with the interrupt's own writes.

The client is this process; on a small machine it shares the CPUs with the services.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before anything imports litellm
os.environ.setdefault("HELIX_LOG_LEVEL", "WARNING")  # inherited by the service processes
# Run as a script, sys.path[0] is tests/bench; put the repository root first (see run.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from helix_transport import AgentClient, HelixError, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.remote import child_session_id
from helix_transport.store import MemoryStore
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.bench.agents import leaf, parent, parent_input

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- rows and statistics


@dataclass(frozen=True, kw_only=True)
class Row:
    scenario: str
    setup: str
    unit: str
    value: float
    baseline: float
    baseline_is: str
    ratio: float
    """value / baseline."""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(
        self,
        scenario: str,
        setup: str,
        unit: str,
        value: float,
        baseline: float,
        baseline_is: str,
    ) -> None:
        ratio = value / baseline if baseline else float("nan")
        self.rows.append(
            Row(
                scenario=scenario,
                setup=setup,
                unit=unit,
                value=value,
                baseline=baseline,
                baseline_is=baseline_is,
                ratio=ratio,
            )
        )


def percentile(samples: list[float], p: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


class Ids:
    """Unique session ids for this run."""

    def __init__(self) -> None:
        self._n = 0
        self._run = f"{os.getpid()}-{int(time.time())}"

    def __call__(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._run}-{self._n:05d}"


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
    assert last is not None
    return elapsed, count, last


def check_completed(final: pb.StreamEvent, expect_ok: int | None = None) -> dict[str, Any]:
    if kind(final) != "completed":
        raise RuntimeError(f"session {final.session_id} ended {kind(final)}: {final}")
    output: dict[str, Any] = json.loads(final.completed.output_json)
    if expect_ok is not None and output.get("ok") != expect_ok:
        raise RuntimeError(f"session {final.session_id}: {output}")
    return output


# ---------------------------------------------------------------- memory


def rss_kib(pid: int | str, field_name: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


class RssPoller:
    """Max VmRSS of some processes, polled every ``interval_s`` while active."""

    def __init__(self, pids: dict[str, int | str], interval_s: float = 0.01) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.peaks = {name: 0 for name in pids}
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self.peaks[name] = max(self.peaks[name], rss_kib(pid))

    async def _poll(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def __enter__(self) -> RssPoller:
        self._task = asyncio.ensure_future(self._poll())
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._task is not None
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
        before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        started = time.perf_counter()
        yield
        self.wall += time.perf_counter() - started
        for name, pid in self.pids.items():
            self.cpu[name] += cpu_seconds(pid) - before[name]

    def busy(self) -> dict[str, int]:
        """Percent of one CPU each process used (100 = one core flat out)."""
        return {name: round(100 * used / self.wall) for name, used in self.cpu.items()}


# ---------------------------------------------------------------- services


class Services:
    """``helix-mesh serve`` processes, each on its own SQLite file in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, ServiceProcess] = {}

    def add(self, name: str, agent: str, *, env: dict[str, str] | None = None) -> ServiceProcess:
        proc = ServiceProcess(
            agent,
            port=free_port(),
            store_url=f"sqlite:///{self.workdir / (name + '.db')}",
            log_path=self.workdir / f"{name}.log",
            env={"HELIX_LOG_LEVEL": "WARNING", **(env or {})},
            cwd=ROOT,
        )
        self.procs[name] = proc
        return proc

    def pids(self) -> dict[str, int | str]:
        """Pids of the bench-agent services and of this process, for the CPU meters."""
        return {"parent": self.pid("parent"), "leaf": self.pid("leaf"), "client": "self"}

    def pid(self, name: str) -> int:
        proc = self.procs[name].proc
        assert proc is not None
        return proc.pid

    async def start(self, *names: str) -> None:
        await asyncio.gather(*(self.procs[n].start(timeout_s=120) for n in names))

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.procs.values()))

    def logged_problems(self) -> list[str]:
        """WARNING/ERROR lines the services logged (the bench runs at WARNING)."""
        lines = []
        for name, proc in self.procs.items():
            if proc.log_path.exists():
                for line in proc.log_path.read_text(errors="replace").splitlines():
                    if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                        lines.append(f"{name}: {line}")
        return lines


# ---------------------------------------------------------------- scenario 1


async def delegation_overhead(
    report: Report, client: AgentClient, setup: str, ids: Ids, sessions: int
) -> None:
    remote: list[float] = []
    local: list[float] = []

    async def once(tool_name: str) -> float:
        elapsed, _, final = await run_session(client, parent_input(tool_name), ids(tool_name))
        check_completed(final, expect_ok=1)
        return elapsed * 1000

    for tool_name in ("local", "child", "local", "child"):  # warm-up
        await once(tool_name)
    for _ in range(sessions):  # alternate, so drift hits both sides alike
        local.append(await once("local"))
        remote.append(await once("child"))
    for p in (50, 99):
        report.add(
            f"1 delegate to 1-step child, p{p} ({sessions} sessions)",
            setup,
            "ms",
            percentile(remote, p),
            percentile(local, p),
            "local tool, same work",
        )
    report.details[f"1 delegation {setup}"] = {
        "remote_ms": _summary(remote),
        "local_ms": _summary(local),
    }


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(samples, 50), 3),
        "p90": round(percentile(samples, 90), 3),
        "p99": round(percentile(samples, 99), 3),
        "max": round(max(samples), 3),
        "mean": round(statistics.fmean(samples), 3),
    }


async def delegation_in_process(report: Report, ids: Ids, sessions: int) -> None:
    """Both servers in this process on one loop, memory stores, loopback gRPC."""
    env_var = address_env_var(leaf.name)
    saved = os.environ.get(env_var)
    leaf_server = await create_server(leaf, MemoryStore(), allow_unauthenticated=True)
    parent_server = await create_server(parent, MemoryStore(), allow_unauthenticated=True)
    try:
        async with leaf_server, parent_server:
            os.environ[env_var] = leaf_server.address
            async with await AgentClient.connect(parent_server.address) as client:
                await delegation_overhead(report, client, "in-process, memory", ids, sessions)
    finally:
        if saved is None:
            os.environ.pop(env_var, None)
        else:
            os.environ[env_var] = saved


# ---------------------------------------------------------------- scenario 2


async def two_hops(
    report: Report,
    services: Services,
    parent_client: AgentClient,
    leaf_client: AgentClient,
    ids: Ids,
    *,
    events: int,
    repeat: int,
) -> None:
    child_input = json.dumps({"mode": "emit", "n": events})

    async def one_hop() -> float:
        elapsed, count, final = await run_session(leaf_client, child_input, ids("hop1"))
        check_completed(final)
        return count / elapsed

    async def two_hop() -> float:
        session_id = ids("hop2")
        started = time.perf_counter()
        await parent_client.start(
            parent_input("child", mode="emit", n=events), session_id=session_id
        )
        count = deltas = 0
        final: pb.StreamEvent | None = None
        async for event in parent_client.stream(session_id):
            count += 1
            if kind(event) == "child_event" and kind(event.child_event.event) == "text_delta":
                deltas += 1
            final = event
        elapsed = time.perf_counter() - started
        assert final is not None
        check_completed(final, expect_ok=1)
        if deltas != events:
            raise RuntimeError(f"two hops: {deltas} of {events} deltas arrived")
        return count / elapsed

    await one_hop()
    await two_hop()
    rates1: list[float] = []
    rates2: list[float] = []
    meters = {"one hop": CpuMeter(services.pids()), "two hops": CpuMeter(services.pids())}
    for _ in range(repeat):
        with meters["one hop"].measure():
            rates1.append(await one_hop())
        with meters["two hops"].measure():
            rates2.append(await two_hop())
    report.add(
        f"2 stream {events:,} events, two hops",
        "processes, sqlite",
        "events/s",
        statistics.median(rates2),
        statistics.median(rates1),
        "one hop (leaf -> client)",
    )
    report.details["2 two hops events/s"] = {"one_hop": rates1, "two_hops": rates2}
    report.details["2 CPU busy %"] = {name: m.busy() for name, m in meters.items()}


# ---------------------------------------------------------------- scenario 3


async def fan_out(
    report: Report,
    services: Services,
    parent_client: AgentClient,
    leaf_client: AgentClient,
    ids: Ids,
    *,
    children: int,
    repeat: int,
) -> None:
    async def via_parent(n: int) -> float:
        elapsed, _, final = await run_session(
            parent_client, parent_input("child", count=n), ids("fan")
        )
        check_completed(final, expect_ok=n)
        return elapsed

    async def direct(n: int) -> float:
        started = time.perf_counter()
        finals = await asyncio.gather(
            *(run_session(leaf_client, '{"mode": "once"}', ids("direct")) for _ in range(n))
        )
        elapsed = time.perf_counter() - started
        for _, _, final in finals:
            check_completed(final)
        return elapsed

    await via_parent(2)  # warm-up: channels, first litellm call, sqlite pages
    await direct(2)
    gc.collect()
    pids: dict[str, int | str] = {
        "parent service": services.pid("parent"),
        "leaf service": services.pid("leaf"),
        "client (this process)": "self",
    }
    idle = {name: rss_kib(pid) for name, pid in pids.items()}
    walls: list[float] = []
    meters = {"fan-out": CpuMeter(services.pids()), "direct": CpuMeter(services.pids())}
    with RssPoller(pids) as poller:
        for _ in range(repeat):
            with meters["fan-out"].measure():
                walls.append(await via_parent(children))
    hwm = {name: rss_kib(pid, "VmHWM") for name, pid in pids.items()}
    direct_walls = []
    for _ in range(repeat):
        with meters["direct"].measure():
            direct_walls.append(await direct(children))
    report.add(
        f"3 fan-out to {children} children, wall",
        "processes, sqlite",
        "ms",
        statistics.median(walls) * 1000,
        statistics.median(direct_walls) * 1000,
        f"client -> {children} leaves direct",
    )
    for name in pids:
        report.add(
            f"3 fan-out {children}: peak RSS, {name}",
            "processes, sqlite",
            "MiB",
            poller.peaks[name] / 1024,
            idle[name] / 1024,
            "idle RSS before",
        )
    report.details[f"3 fan-out {children}"] = {
        "wall_s": walls,
        "direct_wall_s": direct_walls,
        "idle_rss_kib": idle,
        "peak_rss_kib_polled": poller.peaks,
        "vmhwm_kib_after_fan_out": hwm,
    }
    report.details["3 CPU busy %"] = {name: m.busy() for name, m in meters.items()}


# ---------------------------------------------------------------- scenario 4


async def interrupt_latency(report: Report, services: Services, ids: Ids, *, runs: int) -> None:
    clients = {
        name: await AgentClient.connect(services.procs[name].address)
        for name in ("delegator", "middle", "counter")
    }
    nested = {"calls": [{"tool": "count", "args": {"steps": 50, "words": 4}}]}
    root_input = json.dumps({"calls": [{"tool": "delegate", "args": nested}]})
    leaf_input = json.dumps({"steps": 50, "words": 4})

    async def wait_running(client: AgentClient, session_id: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(HelixError):
                status = await client.get_status(session_id)
                if status.status != pb.SESSION_STATUS_RUNNING:
                    raise RuntimeError(f"{session_id} ended before the interrupt: {status}")
                if status.step_count >= 1:
                    return
            await asyncio.sleep(0.005)
        raise TimeoutError(f"{session_id} never ran a step")

    async def until_interrupted(client: AgentClient, session_id: str, t0: float) -> float:
        while True:
            status = await client.get_status(session_id)
            if status.status == pb.SESSION_STATUS_INTERRUPTED:
                return (time.perf_counter() - t0) * 1000
            if status.status != pb.SESSION_STATUS_RUNNING:
                raise RuntimeError(f"{session_id} ended {status.status}, not interrupted")
            await asyncio.sleep(0.002)

    async def timed_rpc(client: AgentClient, session_id: str, t0: float) -> float:
        await client.interrupt(session_id, reason="bench")
        return (time.perf_counter() - t0) * 1000

    async def three_levels() -> dict[str, float]:
        root = ids("root")
        mid = child_session_id(root, "call_1_0")
        leaf_id = child_session_id(mid, "call_1_0")
        await clients["delegator"].start(root_input, session_id=root)
        await wait_running(clients["counter"], leaf_id)
        t0 = time.perf_counter()
        rpc, t_root, t_mid, t_leaf = await asyncio.gather(
            timed_rpc(clients["delegator"], root, t0),
            until_interrupted(clients["delegator"], root, t0),
            until_interrupted(clients["middle"], mid, t0),
            until_interrupted(clients["counter"], leaf_id, t0),
        )
        return {
            "all": max(t_root, t_mid, t_leaf),
            "rpc": rpc,
            "root": t_root,
            "middle": t_mid,
            "leaf": t_leaf,
        }

    async def one_level() -> float:
        session_id = ids("leaf")
        await clients["counter"].start(leaf_input, session_id=session_id)
        await wait_running(clients["counter"], session_id)
        t0 = time.perf_counter()
        _, done = await asyncio.gather(
            timed_rpc(clients["counter"], session_id, t0),
            until_interrupted(clients["counter"], session_id, t0),
        )
        return done

    try:
        await three_levels()  # warm-up
        await one_level()
        samples: list[dict[str, float]] = []
        baseline: list[float] = []
        for _ in range(runs):
            samples.append(await three_levels())
            baseline.append(await one_level())
    finally:
        for client in clients.values():
            await client.aclose()
    for p in (50, 99):
        report.add(
            f"4 interrupt 3 levels -> all interrupted, p{p} ({runs} runs)",
            "processes, sqlite",
            "ms",
            percentile([s["all"] for s in samples], p),
            percentile(baseline, p),
            "1 level (leaf direct)",
        )
    report.details["4 interrupt ms"] = {
        part: _summary([s[part] for s in samples])
        for part in ("all", "rpc", "root", "middle", "leaf")
    } | {"one_level": _summary(baseline)}


# ---------------------------------------------------------------- the run


async def run_all(args: argparse.Namespace) -> Report:
    report = Report()
    ids = Ids()
    with tempfile.TemporaryDirectory(prefix="helix-bench-deleg-") as tmp:
        workdir = Path(tmp)
        services = Services(workdir)
        leaf_proc = services.add("leaf", "tests.bench.agents:leaf")
        services.add(
            "parent",
            "tests.bench.agents:parent",
            env={address_env_var(leaf.name): leaf_proc.address},
        )
        counter = services.add(
            "counter", "tests.agents:counter", env={"HELIX_SCRIPTED_DELAY_MS": "5"}
        )
        middle = services.add(
            "middle",
            "tests.agents:middle",
            env={"HELIX_SCRIPTED_DELAY_MS": "5", "HELIX_AGENT_ADDRESS_COUNTER": counter.address},
        )
        services.add(
            "delegator",
            "tests.agents:delegator",
            env={"HELIX_SCRIPTED_DELAY_MS": "5", "HELIX_AGENT_ADDRESS_MIDDLE": middle.address},
        )
        try:
            started = time.perf_counter()
            await services.start(*services.procs)
            report.details["service startup s"] = round(time.perf_counter() - started, 2)
            # Like the served processes: the long-lived imports leave the collector's reach.
            gc.collect()
            gc.freeze()
            async with (
                await AgentClient.connect(services.procs["parent"].address) as parent_client,
                await AgentClient.connect(leaf_proc.address) as leaf_client,
            ):
                # Fan-out first, on services that have only been warmed up, so their
                # RSS growth is the fan-out's.
                await fan_out(
                    report,
                    services,
                    parent_client,
                    leaf_client,
                    ids,
                    children=args.children,
                    repeat=args.repeat,
                )
                await delegation_overhead(
                    report, parent_client, "processes, sqlite", ids, args.sessions
                )
                await two_hops(
                    report,
                    services,
                    parent_client,
                    leaf_client,
                    ids,
                    events=args.events,
                    repeat=args.repeat,
                )
            await interrupt_latency(report, services, ids, runs=args.interrupts)
        finally:
            await services.stop()
            report.notes += services.logged_problems()
    await delegation_in_process(report, ids, args.sessions)
    report.rows.sort(key=lambda r: r.scenario[0])  # stable: setups keep their order
    return report


# ---------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "grpcio": grpc.__version__,
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "setup": (
            "services: one `helix-mesh serve` process each, SQLite in a tmp dir; "
            "client: this process; in-process rows: servers and client on one loop"
        ),
    }


def fmt(value: float, unit: str) -> str:
    if unit == "events/s":
        return f"{value:,.0f} ev/s"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    return f"{value:,.2f} ms"


def print_table(report: Report, args: argparse.Namespace, elapsed_s: float) -> None:
    info = machine()
    print(
        f"helix-mesh delegation bench: {info['cpu_count']} CPUs, {info['python']}, "
        f"grpcio {info['grpcio']}, load average {info['loadavg_1m_at_end']} at the end"
    )
    print(info["setup"])
    print(
        f"sessions={args.sessions}, events={args.events:,}, children={args.children}, "
        f"interrupts={args.interrupts}; ev/s and fan-out wall = median of {args.repeat} "
        "timed runs after a warm-up"
    )
    print()
    header = ("scenario", "setup", "figure", "baseline", "ratio", "baseline is")
    table = [header] + [
        (
            r.scenario,
            r.setup,
            fmt(r.value, r.unit),
            fmt(r.baseline, r.unit),
            f"{r.ratio:.2f}x",
            r.baseline_is,
        )
        for r in report.rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for i, line in enumerate(table):
        cells = [
            c.ljust(w) if j in (0, 1, 5) else c.rjust(w)
            for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print("ratio = figure / baseline: above 1x is slower (ms) or bigger (MiB); below 1x is")
    print("slower for ev/s.")
    interrupt = report.details.get("4 interrupt ms")
    if interrupt:
        parts = ", ".join(
            f"{part} {interrupt[part]['p50']:.1f}" for part in ("rpc", "root", "middle", "leaf")
        )
        print(f"4 per level, p50 ms from the Interrupt call: {parts}")
    fan = next((v for k, v in report.details.items() if k.startswith("3 fan-out")), None)
    if fan:
        hwm = ", ".join(f"{k} {v / 1024:.1f}" for k, v in fan["vmhwm_kib_after_fan_out"].items())
        print(f"3 VmHWM after the fan-out runs, MiB: {hwm}")
    for key in ("2 CPU busy %", "3 CPU busy %"):
        for phase, busy in report.details.get(key, {}).items():
            parts = ", ".join(f"{name} {pct}%" for name, pct in busy.items())
            print(f"{key[0]} CPU busy during {phase} (100% = one core): {parts}")
    for note in report.notes[:20]:
        print(f"service log: {note}")
    print(f"total {elapsed_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100, help="scenario 1 sessions (100)")
    parser.add_argument("--events", type=int, default=5000, help="scenario 2 events (5000)")
    parser.add_argument("--children", type=int, default=200, help="scenario 3 fan-out (200)")
    parser.add_argument("--interrupts", type=int, default=20, help="scenario 4 runs (20)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs for ev/s and fan-out, median (3)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    args = parser.parse_args()
    if min(args.sessions, args.interrupts) < 2 or min(args.events, args.children, args.repeat) < 1:
        parser.error("need --sessions/--interrupts >= 2 and --events/--children/--repeat >= 1")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)

    started = time.perf_counter()
    report = asyncio.run(run_all(args))
    elapsed = time.perf_counter() - started
    if args.json:
        document = {
            "machine": machine(),
            "params": {
                "sessions": args.sessions,
                "events": args.events,
                "children": args.children,
                "interrupts": args.interrupts,
                "repeat": args.repeat,
            },
            "elapsed_s": round(elapsed, 2),
            "rows": [asdict(r) for r in report.rows],
            "details": report.details,
            "service_log_problems": report.notes,
        }
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print_table(report, args, elapsed)


if __name__ == "__main__":
    main()
