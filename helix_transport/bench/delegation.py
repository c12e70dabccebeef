"""Scenarios 4, 5 and 7: delegation across real service processes.

Every agent is a ``helix-mesh serve`` process on its own SQLite file; the client
is this process (on a small machine it shares the CPUs with the services).

- 4: a leaf's ``events`` text deltas streamed by the client straight from the leaf
  (one hop) and through a parent delegating to it (leaf -> parent -> client). Also
  the delegation overhead: the parent delegating to a one-step leaf, beside the
  same parent doing the leaf's work in a local tool (same litellm turn, no child).
- 5: one parent delegating to ``children`` one-step leaves in one step. Wall time
  beside the client starting as many leaf sessions directly (the two alternated);
  peak RSS of each service (the kernel's ``VmHWM``, reset before each run), its
  PSS/USS polled every 20 ms in one more, untimed run, and beside them the floor:
  the RSS of two processes that do nothing but import litellm and make one streamed
  completion through a custom provider (what any service calling litellm holds
  before serving).
- 7: ``Interrupt`` on a root (root -> parent -> leaf, the leaf emitting paced
  events) until GetStatus says ``interrupted`` for all three, beside one level.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.bench._measure import (
    CpuMeter,
    Ids,
    MemoryPoller,
    check_completed,
    kind,
    memory_kib,
    proc_kib,
    run_session,
)
from helix_transport.bench._report import (
    Report,
    percentile,
    ratio_at_least,
    ratio_at_most,
    summary,
    value_at_most,
)
from helix_transport.bench.agents import leaf, leaf_input, parent, parent_input, root, root_input
from helix_transport.delegation.remote import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from helix_transport.transport import AgentClient

SETUP = "sqlite, processes"
SERVICE_ENV = {
    "HELIX_LOG_LEVEL": "WARNING",
    # Operator policy, not cost: a 1,000-wide fan-out from one principal is 2,000 calls at
    # once, over the default burst (1,000) and at the default session cap (1,000).
    "HELIX_RATE_LIMIT": "0",
    "HELIX_MAX_RUNNING_SESSIONS": "0",
}
"""Environment of every benchmarked service."""
AGENTS = "helix_transport.bench.agents"


class Services:
    """``helix-mesh serve`` processes, each on its own SQLite file in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, ServiceProcess] = {}

    def add(
        self,
        name: str,
        agent: str,
        *,
        env: dict[str, str] | None = None,
        store_url: str = "",
        extra_args: list[str] | None = None,
    ) -> ServiceProcess:
        """Declare a service (``start`` runs it)."""
        proc = ServiceProcess(
            f"{AGENTS}:{agent}",
            port=free_port(),
            store_url=store_url or f"sqlite:///{self.workdir / (name + '.db')}",
            log_path=self.workdir / f"{name}.log",
            env={**SERVICE_ENV, **(env or {})},
            extra_args=extra_args,
        )
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        """The running service's pid."""
        proc = self.procs[name].proc
        if proc is None:
            raise RuntimeError(f"{name} is not running")
        return proc.pid

    async def start(self, *names: str) -> None:
        """Start services and wait until they serve."""
        await asyncio.gather(*(self.procs[n].start(timeout_s=120) for n in names))

    async def stop(self) -> None:
        """Kill every service."""
        await asyncio.gather(*(p.stop() for p in self.procs.values()))

    def logged_problems(self) -> list[str]:
        """WARNING/ERROR lines the services logged (they run at WARNING)."""
        lines = []
        for name, proc in self.procs.items():
            if proc.log_path.exists():
                for line in proc.log_path.read_text(errors="replace").splitlines():
                    if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                        lines.append(f"service log {name}: {line}")
        return lines


def chain(services: Services) -> None:
    """Declare leaf <- parent <- root, each finding the next through its env var."""
    leaf_proc = services.add("leaf", "leaf")
    parent_proc = services.add(
        "parent", "parent", env={address_env_var(leaf.name): leaf_proc.address}
    )
    services.add("root", "root", env={address_env_var(parent.name): parent_proc.address})


# ---------------------------------------------------------------- 4


async def two_hops(
    report: Report, services: Services, ids: Ids, *, events: int, sessions: int, repeat: int
) -> None:
    """Scenario 4: two hops beside one hop; delegation beside a local tool."""
    async with (
        await AgentClient.connect(services.procs["parent"].address) as parent_client,
        await AgentClient.connect(services.procs["leaf"].address) as leaf_client,
    ):
        await _one_hop(leaf_client, ids, events)
        await _two_hop(parent_client, ids, events)
        rates1: list[float] = []
        rates2: list[float] = []
        pids: dict[str, int | str] = {
            "parent": services.pid("parent"),
            "leaf": services.pid("leaf"),
            "client": "self",
        }
        meters = {"one hop": CpuMeter(pids), "two hops": CpuMeter(pids)}
        for _ in range(repeat):
            with meters["one hop"].measure():
                rates1.append(await _one_hop(leaf_client, ids, events))
            with meters["two hops"].measure():
                rates2.append(await _two_hop(parent_client, ids, events))
        report.add(
            f"4 two hops, {events:,} events",
            SETUP,
            "events/s",
            statistics.median(rates2),
            statistics.median(rates1),
            "one hop (leaf -> client)",
            ratio_at_least(0.7),
        )
        report.details["4 two hops events/s"] = {"one_hop": rates1, "two_hops": rates2}
        report.details["4 CPU busy %"] = {name: m.busy() for name, m in meters.items()}
        await _delegation_overhead(report, parent_client, ids, sessions=sessions)


async def _one_hop(leaf_client: AgentClient, ids: Ids, events: int) -> float:
    """Events/s of the leaf's deltas streamed by the client straight from the leaf."""
    elapsed, count, final = await run_session(
        leaf_client, leaf_input(mode="emit", n=events), ids("hop1")
    )
    check_completed(final)
    return count / elapsed


async def _two_hop(parent_client: AgentClient, ids: Ids, events: int) -> float:
    """Events/s of the same deltas forwarded through a parent delegating to the leaf."""
    session_id = ids("hop2")
    started = time.perf_counter()
    await parent_client.start(parent_input("child", mode="emit", n=events), session_id=session_id)
    received: list[pb.StreamEvent] = []
    async for event in parent_client.stream(session_id):
        received.append(event)  # inspected after the clock stops, as in _one_hop
    elapsed = time.perf_counter() - started
    if not received:
        raise RuntimeError(f"session {session_id}: no events")
    count, final = len(received), received[-1]
    check_completed(final, expect_ok=1)
    deltas = sum(
        1
        for event in received
        if kind(event) == "child_event" and kind(event.child_event.event) == "text_delta"
    )
    if deltas != events:
        raise RuntimeError(f"two hops: {deltas} of {events} deltas arrived")
    return count / elapsed


async def _delegation_overhead(
    report: Report, parent_client: AgentClient, ids: Ids, *, sessions: int
) -> None:
    """The parent delegating to a one-step leaf beside doing its work in a local tool."""
    remote: list[float] = []
    local: list[float] = []
    for tool_name in ("local", "child"):  # warm-up
        await _delegate_once(parent_client, ids, tool_name)
    for _ in range(sessions):  # alternate, so drift hits both sides alike
        local.append(await _delegate_once(parent_client, ids, "local"))
        remote.append(await _delegate_once(parent_client, ids, "child"))
    report.add(
        f"4 delegate to a 1-step child p50, {sessions} sessions",
        SETUP,
        "ms",
        percentile(remote, 50),
        percentile(local, 50),
        "same work in a local tool",
    )
    report.details["4 delegation ms"] = {"remote": summary(remote), "local": summary(local)}


async def _delegate_once(parent_client: AgentClient, ids: Ids, tool_name: str) -> float:
    """Milliseconds of one parent session calling ``tool_name`` once."""
    elapsed, _, final = await run_session(parent_client, parent_input(tool_name), ids(tool_name))
    check_completed(final, expect_ok=1)
    return elapsed * 1000


# ---------------------------------------------------------------- 5

_KIB_MB = 1024 / 1e6
"""KiB (what /proc reports) to MB (10**6 bytes, the unit of the issue's 400 MB)."""

# What a process holds once it has imported litellm and made one streamed completion
# through a custom provider, and nothing else: no gRPC, no store, no helix.
_LITELLM_FLOOR = """
import asyncio
import litellm
from litellm.llms.custom_llm import CustomLLM

class Echo(CustomLLM):
    async def astreaming(self, *args, **kwargs):
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        yield {"text": "ok", "is_finished": True, "finish_reason": "stop", "index": 0,
               "tool_use": None, "usage": usage}

litellm.custom_provider_map = [{"provider": "floor", "custom_handler": Echo()}]

async def main():
    messages = [{"role": "user", "content": "hi"}]
    response = await litellm.acompletion(model="floor/echo", messages=messages, stream=True)
    async for _ in response:
        pass

asyncio.run(main())
print(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
"""


async def litellm_floor_kib() -> int:
    """The RSS (KiB) of one process that only imports litellm and makes one call."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _LITELLM_FLOOR, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the litellm floor process exited {proc.returncode}")
    return int(out.split()[-1])


async def fan_out(
    report: Report, services: Services, ids: Ids, *, children: int, repeat: int
) -> None:
    """Scenario 5: one parent delegating to ``children`` leaves at once."""
    async with (
        await AgentClient.connect(services.procs["parent"].address) as parent_client,
        await AgentClient.connect(services.procs["leaf"].address) as leaf_client,
    ):
        # warm-up: channels, first litellm call, sqlite pages
        await _fan_out_via_parent(parent_client, ids, 2)
        await _fan_out_direct(leaf_client, ids, 2)
        gc.collect()
        pids: dict[str, int | str] = {
            "parent service": services.pid("parent"),
            "leaf service": services.pid("leaf"),
        }
        idle = {name: memory_kib(pid) for name, pid in pids.items()}
        walls: list[float] = []
        direct_walls: list[float] = []
        peak_rss = {name: 0 for name in pids}
        # Each run's RSS before it and peak, per service: after the first round the leaf
        # starts from what the direct run left it holding (glibc keeps what was freed).
        runs: list[dict[str, tuple[int, int]]] = []
        exact = all(_reset_peak_rss(pid) for pid in pids.values())
        for _ in range(repeat):  # alternate, so the host's drift hits both sides alike
            before = {name: proc_kib(pid, "VmRSS") for name, pid in pids.items()}
            walls.append(await _fan_out_via_parent(parent_client, ids, children))
            runs.append({n: (before[n], proc_kib(pid, "VmHWM")) for n, pid in pids.items()})
            for name, pid in pids.items():
                peak_rss[name] = max(peak_rss[name], proc_kib(pid, "VmHWM"))
            direct_walls.append(await _fan_out_direct(leaf_client, ids, children))
            exact = exact and all(_reset_peak_rss(pid) for pid in pids.values())
        # PSS has no kernel high-water mark: it is polled, in one more run whose wall is
        # not counted. A sample reads smaps_rollup (~5 ms of this process's CPU each
        # read, three a process), which took half a core of the two while the timed
        # runs ran beside it, and none while the direct ones did.
        with MemoryPoller(pids) as poller:
            await _fan_out_via_parent(parent_client, ids, children)
    if exact:
        poller.peaks = {
            name: {**peaks, "rss": max(peaks["rss"], peak_rss[name])}
            for name, peaks in poller.peaks.items()
        }
    report.add(
        f"5 fan-out to {children:,} children: wall",
        SETUP,
        "ms",
        statistics.median(walls) * 1000,
        statistics.median(direct_walls) * 1000,
        "client -> as many leaves directly",
        ratio_at_most(1.2),
    )
    floor = [await litellm_floor_kib() for _ in pids]  # one after the other: no contention
    # The target's row: the first fan-out, from idle. Later rounds start from what the
    # direct run of as many sessions left the leaf holding (glibc keeps what was freed).
    first_peak = sum(peak for _, peak in runs[0].values()) if exact and runs else None
    idle_rss = _add_fan_out_memory(
        report, children, idle=idle, poller=poller, floor=floor, first_peak_kib=first_peak
    )
    report.add(
        f"5 floor: {len(floor)} processes that only import litellm, one call each: RSS",
        "no server, no store",
        "MB",
        sum(floor) * _KIB_MB,
        idle_rss,
        "the services' idle RSS (above)",
    )
    report.details[f"5 fan-out {children}"] = {
        "wall_s": walls,
        "direct_wall_s": direct_walls,
        "idle_kib": idle,
        "peak_kib": poller.peaks,
        "rss_before_and_peak_kib_per_run": runs,
        "litellm_floor_kib": floor,
    }


def _reset_peak_rss(pid: int | str) -> bool:
    """Reset the process's ``VmHWM`` (its peak RSS, kept exactly by the kernel) to its
    RSS now; False where the kernel does not let us (the polled peak counts then)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


async def _fan_out_via_parent(parent_client: AgentClient, ids: Ids, n: int) -> float:
    """Seconds for the parent to delegate to ``n`` one-step leaves in one step."""
    elapsed, _, final = await run_session(parent_client, parent_input("child", count=n), ids("fan"))
    check_completed(final, expect_ok=n)
    return elapsed


async def _fan_out_direct(leaf_client: AgentClient, ids: Ids, n: int) -> float:
    """Seconds for the client to run ``n`` leaf sessions at once itself."""
    started = time.perf_counter()
    finals = await asyncio.gather(
        *(run_session(leaf_client, leaf_input(), ids("direct")) for _ in range(n))
    )
    elapsed = time.perf_counter() - started
    for _, _, final in finals:
        check_completed(final)
    return elapsed


def _add_fan_out_memory(
    report: Report,
    children: int,
    *,
    idle: dict[str, dict[str, int]],
    poller: MemoryPoller,
    floor: list[int],
    first_peak_kib: int | None,
) -> float:
    """The peak RSS and PSS rows beside the idle ones, and the first fan-out's peak above
    the litellm floor (issue 50's target: at most 64 MB; the highest peak where the
    kernel keeps no exact one); returns the idle RSS (MB)."""
    peak_rss = sum(p["rss"] for p in poller.peaks.values()) * _KIB_MB
    idle_rss = sum(m["rss"] for m in idle.values()) * _KIB_MB
    report.add(
        f"5 fan-out to {children:,}: peak RSS, both services",
        SETUP,
        "MB",
        peak_rss,
        idle_rss,
        "their idle RSS just before",
    )
    report.add(
        f"5 fan-out to {children:,}: peak PSS, both services",
        SETUP,
        "MB",
        poller.peak_total_pss * _KIB_MB,
        sum(m["pss"] for m in idle.values()) * _KIB_MB,
        "their idle PSS just before",
    )
    floor_rss = sum(floor) * _KIB_MB
    first = peak_rss if first_peak_kib is None else first_peak_kib * _KIB_MB
    report.add(
        f"5 fan-out to {children:,}: peak RSS above the litellm floor, both services",
        f"{SETUP}, first fan-out, from idle",
        "MB",
        first - floor_rss,
        idle_rss - floor_rss,
        "their idle RSS above the floor",
        value_at_most(64),
    )
    return idle_rss


# ---------------------------------------------------------------- 7


async def interrupt_latency(report: Report, services: Services, ids: Ids, *, runs: int) -> None:
    """Scenario 7: Interrupt on a root until all three levels report ``interrupted``."""
    names = ("root", "parent", "leaf")
    clients = {name: await AgentClient.connect(services.procs[name].address) for name in names}
    busy = leaf_input(mode="emit", n=100_000, pace_ms=5)
    try:
        await _three_levels(clients, ids)  # warm-up
        await _one_level(clients["leaf"], ids, busy)
        samples: list[dict[str, float]] = []
        baseline: list[float] = []
        for _ in range(runs):
            samples.append(await _three_levels(clients, ids))
            baseline.append(await _one_level(clients["leaf"], ids, busy))
    finally:
        for client in clients.values():
            await client.aclose()
    everything = [s["all"] for s in samples]
    for p, target in ((50, value_at_most(50)), (99, None)):
        report.add(
            f"7 interrupt 3 levels -> all interrupted p{p}, {runs} runs",
            SETUP,
            "ms",
            percentile(everything, p),
            percentile(baseline, p),
            "1 level (leaf directly)",
            target,
        )
    report.details["7 interrupt ms"] = {
        "all": summary(everything),
        "root": summary([s["root"] for s in samples]),
        "leaf": summary([s["leaf"] for s in samples]),
        "one_level": summary(baseline),
    }


async def _wait_emitting(client: AgentClient, session_id: str) -> None:
    """Until the session streams its first text delta."""
    async with asyncio.timeout(60):
        while True:
            with contextlib.suppress(HelixError):
                async for event in client.stream(session_id):
                    if kind(event) == "text_delta":
                        return
            await asyncio.sleep(0.01)  # the child session is not there yet


async def _until_interrupted(client: AgentClient, session_id: str, t0: float) -> float:
    """Milliseconds from ``t0`` until GetStatus says the session is interrupted."""
    async with asyncio.timeout(30):
        while True:
            status = await client.get_status(session_id)
            if status.status == pb.SESSION_STATUS_INTERRUPTED:
                return (time.perf_counter() - t0) * 1000
            if status.status != pb.SESSION_STATUS_RUNNING:
                raise RuntimeError(f"{session_id} ended {status.status}, not interrupted")
            await asyncio.sleep(0.002)


async def _three_levels(clients: dict[str, AgentClient], ids: Ids) -> dict[str, float]:
    """Interrupt a root whose leaf emits; milliseconds until each level is interrupted."""
    root_id = ids("root")
    parent_id = child_session_id(root_id, "call_1_0", child_scope(root.name, ""))
    leaf_id = child_session_id(parent_id, "call_1_0", child_scope(parent.name, ""))
    await clients["root"].start(root_input(mode="emit", n=100_000, pace_ms=5), session_id=root_id)
    await _wait_emitting(clients["leaf"], leaf_id)
    t0 = time.perf_counter()
    _, t_root, t_parent, t_leaf = await asyncio.gather(
        clients["root"].interrupt(root_id, reason="bench"),
        _until_interrupted(clients["root"], root_id, t0),
        _until_interrupted(clients["parent"], parent_id, t0),
        _until_interrupted(clients["leaf"], leaf_id, t0),
    )
    return {"all": max(t_root, t_parent, t_leaf), "root": t_root, "leaf": t_leaf}


async def _one_level(leaf_client: AgentClient, ids: Ids, busy: str) -> float:
    """Interrupt an emitting leaf directly; milliseconds until it is interrupted."""
    session_id = ids("leaf")
    await leaf_client.start(busy, session_id=session_id)
    await _wait_emitting(leaf_client, session_id)
    t0 = time.perf_counter()
    _, done = await asyncio.gather(
        leaf_client.interrupt(session_id, reason="bench"),
        _until_interrupted(leaf_client, session_id, t0),
    )
    return done
