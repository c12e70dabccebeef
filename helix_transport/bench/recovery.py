"""Scenario 8: a child's service dies (SIGKILL) mid-stream; how soon does the parent's
client see the child's next event?

- restart: the leaf service is started again on the same port and replica id; the
  clock starts when it answers its health check (SERVING), polled every 20 ms on a
  channel that retries fast (gRPC's default reconnect backoff noticed it seconds late,
  after the parent was receiving events again: the figure was the events' pacing).
- takeover: two leaf replicas share one store (``--lease-ttl 1``) behind one
  round-robin target; the replica running the child is killed and the clock
  starts when its lease expires (the store's ``lease_expires_at``).

Either way it stops when the client streaming the parent session receives the
next ``child_event`` text delta, forwarded by the parent's reconnecting stream.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from helix_transport.agent.tools import child_scope
from helix_transport.bench._measure import Ids, kind
from helix_transport.bench._report import Report, percentile, summary, value_at_most
from helix_transport.bench.agents import leaf, parent, parent_input
from helix_transport.bench.delegation import SETUP, Services
from helix_transport.delegation.remote import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.store import Store, open_store
from helix_transport.testing.processes import ServiceProcess
from helix_transport.transport import AgentClient


class _Follower:
    """Streams a parent session in the background, noting when child deltas arrive."""

    def __init__(self, client: AgentClient, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.arrivals: list[float] = []
        """``time.perf_counter()`` of every child text delta, in order."""
        self._arrived = asyncio.Condition()
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        try:
            async for event in self.client.stream(self.session_id):
                if kind(event) == "child_event" and kind(event.child_event.event) == "text_delta":
                    self.arrivals.append(time.perf_counter())
                    async with self._arrived:
                        self._arrived.notify_all()
        finally:
            async with self._arrived:
                self._arrived.notify_all()

    def _first_after(self, perf: float) -> float | None:
        index = bisect.bisect_right(self.arrivals, perf)
        return self.arrivals[index] if index < len(self.arrivals) else None

    async def next_after(self, perf: float, *, timeout_s: float = 60) -> float:
        """The perf_counter time of the first child delta that arrived after ``perf``."""
        async with asyncio.timeout(timeout_s), self._arrived:
            await self._arrived.wait_for(
                lambda: self._first_after(perf) is not None or self.task.done()
            )
        first = self._first_after(perf)
        if first is None:
            raise RuntimeError(f"{self.session_id}: the stream ended without a new child event")
        return first

    async def aclose(self) -> None:
        """Stop following."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


async def _run(
    client: AgentClient,
    ids: Ids,
    kill_and_recover: Callable[[str], Awaitable[float]],
) -> float:
    """One parent session; ``kill_and_recover(child id)`` kills the child's service,
    brings it (or its replica) back and returns the perf_counter time the clock
    starts at. Returns the milliseconds until the parent's client sees a child delta."""
    session_id = ids("recover")
    paced = parent_input("child", mode="emit", n=1_000_000, pace_ms=10)
    await client.start(paced, session_id=session_id)
    follower = _Follower(client, session_id)
    try:
        await follower.next_after(0.0)  # the child is streaming
        t0 = await kill_and_recover(
            child_session_id(session_id, "call_1_0", child_scope(parent.name, ""))
        )
        t1 = await follower.next_after(t0)
        return (t1 - t0) * 1000
    finally:
        await follower.aclose()
        with contextlib.suppress(Exception):
            await client.interrupt(session_id, reason="bench done")


async def restart(report: Report, workdir: Path, ids: Ids, *, runs: int) -> None:
    """8, restart: SIGKILL the leaf's service and start it again."""
    services = Services(workdir / "restart")
    (workdir / "restart").mkdir()
    leaf_proc = services.add("leaf", "leaf")
    services.add("parent", "parent", env={address_env_var(leaf.name): leaf_proc.address})
    try:
        await services.start("leaf", "parent")
        async with await AgentClient.connect(services.procs["parent"].address) as client:
            restarts: list[float] = []

            async def kill_and_restart(child_id: str) -> float:
                killed = time.perf_counter()
                await leaf_proc.kill()
                await leaf_proc.start(timeout_s=120)  # SERVING seen within ~20 ms
                back = time.perf_counter()
                restarts.append((back - killed) * 1000)
                return back

            samples = [await _run(client, ids, kill_and_restart) for _ in range(runs)]
    finally:
        await services.stop()
        report.notes += [n for n in services.logged_problems() if "Traceback" in n][:5]
    report.add(
        f"8 SIGKILL child service, restart -> next event p50, {runs} runs",
        SETUP,
        "ms",
        percentile(samples, 50),
        float("nan"),
        "none (clock starts when the child serves again)",
        value_at_most(1000),
    )
    report.details["8 restart ms"] = summary(samples)
    # Not in the figure: the new process's start (Python, litellm's import, the store).
    report.details["8 restart: SIGKILL to SERVING ms"] = summary(restarts)


async def takeover(report: Report, workdir: Path, ids: Ids, *, runs: int) -> None:
    """8, takeover: SIGKILL the replica running the child; the other takes it over."""
    directory = workdir / "takeover"
    directory.mkdir()
    store_url = f"sqlite:///{directory / 'shared.db'}"
    services = Services(directory)
    lease = ["--lease-ttl", "1", "--drain-timeout", "0.5"]
    a = services.add("leaf-a", "leaf", store_url=store_url, extra_args=lease)
    b = services.add("leaf-b", "leaf", store_url=store_url, extra_args=lease)
    target = f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"
    services.add("parent", "parent", env={address_env_var(leaf.name): target})
    store: Store | None = None
    dead: list[ServiceProcess] = []
    try:
        await services.start("leaf-a", "leaf-b", "parent")
        store = await open_store(store_url)
        replicas = {f"local-{p.port}": p for p in (a, b)}
        async with await AgentClient.connect(services.procs["parent"].address) as client:

            async def kill_owner(child_id: str) -> float:
                assert store is not None
                record = await store.get_session(child_id)
                if record is None or record.owner not in replicas:
                    raise RuntimeError(f"{child_id}: no live owner ({record})")
                owner = replicas[record.owner]
                await owner.kill()
                dead.append(owner)
                killed = await store.get_session(child_id)
                assert killed is not None
                # The clock starts at lease expiry (the store's wall clock), in
                # perf_counter terms.
                return time.perf_counter() + (killed.lease_expires_at - time.time())

            samples = []
            for _ in range(runs):
                samples.append(await _run(client, ids, kill_owner))
                while dead:  # back as the spare for the next run
                    await dead.pop().start(timeout_s=120)
    finally:
        if store is not None:
            await store.aclose()
        await services.stop()
        report.notes += [n for n in services.logged_problems() if "Traceback" in n][:5]
    report.add(
        f"8 SIGKILL child replica, takeover -> next event p50, {runs} runs",
        "sqlite shared, processes",
        "ms",
        percentile(samples, 50),
        1000.0,
        "the lease TTL (1 s)",
        value_at_most(1000),
    )
    report.details["8 takeover ms (from lease expiry)"] = summary(samples)
