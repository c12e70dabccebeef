"""The root's log is the tree, across SIGKILLs of either side.

Three services (``tests/agents/forwarding.py``): ``fw-root`` delegates to ``fw-mid``s and
they to ``fw-leaf``s, each parent to one child of every kind (a remote tool call, a
blocking companion, a ``run_subagent`` task): 13 sessions, three levels. Each case
kills services at seeded random points of the root's log while the tree runs (a child's service, a
parent's, or all of them at once: SIGKILL, a pause, a restart on the same store), then:

- the root's log holds every event of every session below it exactly once, in order,
  with no gap: each session's forwarded sequences are 1..its own last sequence;
- each child has one ``subagent_start`` and one ``subagent_end`` in its parent's log,
  however often its parent was killed;
- the fold of the root's log (``fold_events``) gives the tree every service reports
  (status, output, own usage, and the subtree's: ``GetStatus(include_children=true)``);
- with every child service stopped, the fold of the root's log alone gives the same
  totals.

The default run takes two seeded cases; ``pytest -m slow`` runs more
(``HELIX_FORWARDING_SEEDS=N`` sets how many).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import AgentClient, SessionStatus, TreeNode, TreeUsage, fold_events
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from tests.helpers import ROOT, ServiceProcess, free_port

ROLES = {"leaf": "fw_leaf", "mid": "fw_mid", "root": "fw_root"}
TYPES = {"leaf": "fw-leaf", "mid": "fw-mid", "root": "fw-root"}
KINDS = ("remote", "agent", "task")
"""A child id's kind: a remote tool's, a companion's, a run_subagent task's."""
DEFAULT_PLANS = [("mid", "leaf"), ("root", "root+mid+leaf")]
"""The fixed cases' victims, in order: each kill lands at a seeded random moment."""


@asynccontextmanager
async def mesh(workdir: Path) -> AsyncIterator[dict[str, ServiceProcess]]:
    """The three services, each with its own SQLite store, children found by registry."""
    services: dict[str, ServiceProcess] = {}
    ports = {role: free_port() for role in ROLES}
    for role, child in (("leaf", None), ("mid", "leaf"), ("root", "mid")):
        env = {"HELIX_SCRIPTED_DELAY_MS": "25"}
        if child is not None:
            env[address_env_var(TYPES[child])] = f"127.0.0.1:{ports[child]}"
        services[role] = ServiceProcess(
            f"tests.agents.forwarding:{ROLES[role]}",
            port=ports[role],
            store_url=f"sqlite:///{workdir / (role + '.db')}",
            log_path=workdir / f"{role}.log",
            env=env,
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )
    await asyncio.gather(*(s.start(timeout_s=120) for s in services.values()))
    try:
        yield services
    finally:
        await asyncio.gather(*(s.stop() for s in services.values()))


async def kill_and_restart(services: dict[str, ServiceProcess], victims: str) -> None:
    roles = victims.split("+")
    await asyncio.gather(*(services[r].kill() for r in roles))
    await asyncio.sleep(0.3)
    await asyncio.gather(*(services[r].start(timeout_s=120) for r in roles))


class Seen:
    """How many of the root's events the follower has read."""

    def __init__(self) -> None:
        self.count = 0
        self.more = asyncio.Event()


async def follow(address: str, session_id: str, seen: Seen) -> None:
    """Count the root's events as they come, through every restart of its service."""
    async with await AgentClient.connect(address) as client:
        async for _ in client.stream(session_id, retry=client.config.reconnect.until_cancelled()):
            seen.count += 1
            seen.more.set()


async def read_root(address: str, session_id: str) -> list[pb.StreamEvent]:
    async with await AgentClient.connect(address) as client:
        retry = client.config.reconnect.until_cancelled()
        return [e async for e in client.stream(session_id, retry=retry)]


def unwrapped(events: list[pb.StreamEvent]) -> Iterator[pb.StreamEvent]:
    """Every event at every depth, as logged (no deduplication: that is what is checked)."""
    for event in events:
        yield event
        if event.WhichOneof("payload") == "child_event":
            yield from unwrapped([event.child_event.event])


async def reported(services: dict[str, ServiceProcess], node: TreeNode) -> pb.GetStatusResponse:
    role = next(r for r, t in TYPES.items() if t == node.agent_type)
    async with await AgentClient.connect(services[role].address) as client:
        return await client.get_status(node.session_id, include_children=True)


def usage(u: pb.TokenUsage) -> TreeUsage:
    return TreeUsage.from_proto(u)


async def run_case(workdir: Path, seed: int, plan: tuple[str, ...]) -> None:
    rng = random.Random(seed)
    root_id = f"fw-{seed}"
    async with mesh(workdir) as services:
        async with await AgentClient.connect(services["root"].address) as client:
            await client.start(json.dumps({"text": f"s{seed}"}), session_id=root_id)
        seen = Seen()
        follower = asyncio.create_task(follow(services["root"].address, root_id, seen))
        for victims in plan:
            # Somewhere in the next stretch of the root's log (most of it is forwarded).
            target = seen.count + rng.randint(5, 150)
            while seen.count < target and not follower.done():
                seen.more.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1):  # the follower may have ended meanwhile
                        await seen.more.wait()
            await kill_and_restart(services, victims)
        async with asyncio.timeout(300):
            await follower
            events = await read_root(services["root"].address, root_id)

        assert events[-1].WhichOneof("payload") == "completed", events[-1]
        # Exactly once, in order, no gap, at every depth.
        by_session: dict[str, list[int]] = {}
        for event in unwrapped(events):
            by_session.setdefault(event.session_id, []).append(event.sequence)
        assert len(by_session) == 13, sorted(by_session)
        for session, sequences in by_session.items():
            assert sequences == list(range(1, len(sequences) + 1)), (session, sequences)

        tree = fold_events(events)
        assert tree.root is not None
        nodes = list(tree.root.walk())
        assert len(nodes) == 13
        # Every kind of child under each delegating session, three levels deep.
        for node in nodes:
            if node.agent_type != "fw-leaf":
                own = [c.session_id[len(node.session_id) :] for c in node.children]
                kinds = sorted(k for tail in own for k in KINDS if tail.startswith(f"-{k}-"))
                assert kinds == sorted(KINDS), (
                    node.session_id,
                    [c.session_id for c in node.children],
                )
        assert {n.agent_type for n in nodes for _ in n.children} == {"fw-root", "fw-mid"}
        for node in nodes:
            # One start and one end per child in its parent's own events.
            starts = Counter(
                e.subagent_start.child_session_id
                for e in node.events
                if e.HasField("subagent_start")
            )
            ends = Counter(
                e.subagent_end.child_session_id for e in node.events if e.HasField("subagent_end")
            )
            children = {c.session_id for c in node.children}
            assert starts == dict.fromkeys(children, 1), (node.session_id, starts)
            assert ends == dict.fromkeys(children, 1), (node.session_id, ends)
            status = await reported(services, node)
            assert by_session[node.session_id][-1] == status.last_sequence  # all of it
            assert node.status is SessionStatus.COMPLETED
            assert node.status.to_proto() == status.status
            assert json.loads(node.output_json or "") == json.loads(status.output_json)
            assert node.usage == usage(status.usage) and node.usage.total_tokens > 0
            assert node.total_usage == usage(status.total_usage), node.session_id
        root_total = tree.root.total_usage
        assert root_total.total_tokens == sum(n.usage.total_tokens for n in nodes)

        # Every child's service down: the root's log alone still totals the tree.
        await asyncio.gather(services["mid"].stop(), services["leaf"].stop())
        again = fold_events(await read_root(services["root"].address, root_id))
        assert again.root is not None and again.root.total_usage == root_total
        assert [n.to_json() for n in again.root.walk()] == [n.to_json() for n in nodes]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "case",
    # The root's kills in the default run; the others (and random plans) under -m slow.
    [pytest.param(0, marks=pytest.mark.slow), 1],
)
async def test_the_roots_log_is_the_tree_across_kills(tmp_path: Path, case: int) -> None:
    await run_case(tmp_path, seed=case + 1, plan=DEFAULT_PLANS[case])


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "seed", range(100, 100 + int(os.environ.get("HELIX_FORWARDING_SEEDS", "8")))
)
async def test_the_roots_log_is_the_tree_across_random_kills(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    choices = ["leaf", "mid", "root", "mid+leaf", "root+mid", "root+mid+leaf"]
    plan = tuple(rng.choice(choices) for _ in range(rng.randint(1, 3)))
    await run_case(tmp_path, seed=seed, plan=plan)
