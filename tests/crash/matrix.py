"""The crash matrix: SIGKILL a delegation's processes at every point of its run.

    python -m tests.crash.matrix [--store sqlite,redis,postgres] [--depth 2|3]
                                 [--samples 6] [--down 0,1.5] [--once]

A parent service (``delegator``) delegates to two children on a child service
(``counter``); with ``--depth 3`` it delegates to a middle service (``middle``) that
delegates to the two. Each is a real ``helix-mesh serve`` process with its own store.
For each case the client starts a fresh root session, reads the parent's stream until
it has seen the event with the case's sequence, SIGKILLs the case's victim (one
service, or all of them), leaves it down for ``down_s`` and restarts it on the same
port and store (in some cases killing it again as soon as it serves, mid-recovery),
then reads on from the last sequence it saw. The points come from an undisturbed run:
after each of the parent's own events (so kills land before the children start,
between a child's end and the parent's, in the parent's closing model call) and spread
over the children's streaming.

Every case must hold the same invariants, whatever the point, for every session of
the tree:

- the client's view of the root's log is gapless from 1, and a replay from 0 returns
  exactly the bytes it was sent live;
- each log is gapless, has one ``run_started`` and ends ``completed`` with the right
  output;
- each child's events appear in its parent's log once each, in order, byte for byte
  its own log;
- nothing ran twice that was not in flight: a session makes the model calls of an
  undisturbed run, at most one more per kill of its own service (the step it was in
  may be asked again).

The default test run takes a short version (``tests/crash/test_matrix.py``); the full
matrix runs under ``pytest -m slow`` and as this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.bench.streams import drop_store_data, store_url
from helix_transport.delegation.remote import child_session_id
from helix_transport.testing.processes import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parents[2]

COUNTS = ({"steps": 3, "words": 3}, {"steps": 4, "words": 2})
"""The leaves: two counters, delegated in one step."""
SERVICES = {"parent": "delegator", "middle": "middle", "child": "counter"}
"""Each role's agent; a depth-2 mesh has no middle."""


def victims(depth: int) -> tuple[str, ...]:
    """Which services a case may kill: each alone, then all of them at once."""
    roles = ("child", "middle", "parent") if depth == 3 else ("child", "parent")
    return (*roles, "+".join(reversed(roles)))


@dataclass(frozen=True)
class Node:
    """One session of the delegation tree, and the model calls an undisturbed run makes."""

    role: str
    session_id: str
    model: str
    calls: int
    output: object
    children: tuple[tuple[str, Node], ...] = ()
    """(the parent's tool call id, the child's session)."""


def tree(root: str, depth: int) -> tuple[str, Node]:
    """The root's input and the sessions a delegation of ``depth`` levels makes."""

    def leaves(parent: str, parent_type: str) -> tuple[tuple[str, Node], ...]:
        nodes = []
        for i, args in enumerate(COUNTS):
            call_id, steps = f"call_1_{i}", args["steps"]
            output = {"total": steps, "steps": steps}
            leaf = Node(
                "child",
                child_session_id(parent, call_id, child_scope(parent_type, "")),
                "counter",
                steps + 1,
                output,
            )
            nodes.append((call_id, leaf))
        return tuple(nodes)

    counts = [{"tool": "count", "args": args} for args in COUNTS]
    results = {"results": [leaf.output for _, leaf in leaves(root, SERVICES["parent"])]}
    if depth == 2:
        return json.dumps({"calls": counts}), Node(
            "parent", root, "delegate", 2, results, leaves(root, SERVICES["parent"])
        )
    middle_id = child_session_id(root, "call_1_0", child_scope(SERVICES["parent"], ""))
    middle = Node(
        "middle", middle_id, "delegate", 2, results, leaves(middle_id, SERVICES["middle"])
    )
    wanted = {"calls": [{"tool": "delegate", "args": {"calls": counts}}]}
    return json.dumps(wanted), Node(
        "parent", root, "delegate", 2, {"results": [results]}, (("call_1_0", middle),)
    )


@dataclass(frozen=True)
class Case:
    victim: str
    """A role (``child``, ``middle``, ``parent``) or several joined by ``+``."""
    at: int
    """Kill once the client has seen the parent's event with this sequence."""
    down_s: float = 0.0
    again: bool = False
    """Kill the victim a second time as soon as it serves again (mid-recovery)."""

    def __str__(self) -> str:
        down = f"+{self.down_s:g}s" if self.down_s else ""
        return f"{self.victim}@{self.at}{down}" + (" twice" if self.again else "")


@dataclass
class Outcome:
    case: Case
    violations: list[str] = field(default_factory=list)
    killed_after: str = ""
    """The parent's last event the client saw before the kill (its payload kind)."""
    done_s: float = 0.0
    """From the (first) kill to the parent's ``completed``: restarts included, so this is
    mostly how long a service process takes to start on the host."""


def _kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or "?"


class Mesh:
    """A chain of services (parent, middle if depth 3, child) on one store backend, each
    with its own store; each case uses its own root session."""

    def __init__(self, workdir: Path, store: str, depth: int) -> None:
        self.workdir = workdir
        self.store = store
        self.depth = depth
        self.calls_log = workdir / "calls.log"
        roles = ["child", "middle", "parent"] if depth == 3 else ["child", "parent"]
        self.urls = {role: store_url(store, workdir, label=role) for role in roles}
        self.services: dict[str, ServiceProcess] = {}
        for role, below in zip(roles, [None, *roles], strict=False):
            # Each service finds the one below it through the mesh registry's variable.
            env = {} if below is None else {
                f"HELIX_AGENT_ADDRESS_{SERVICES[below].upper()}": self.services[below].address
            }  # fmt: skip
            self.services[role] = self._service(role, env=env)

    def _service(self, role: str, *, env: dict[str, str]) -> ServiceProcess:
        return ServiceProcess(
            f"tests.agents:{SERVICES[role]}",
            port=free_port(),
            store_url=self.urls[role],
            log_path=self.workdir / f"{role}.log",
            env={
                "HELIX_SCRIPTED_DELAY_MS": "10",
                "HELIX_SCRIPTED_CALL_LOG": str(self.calls_log),
                **env,
            },
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )

    @property
    def parent(self) -> ServiceProcess:
        return self.services["parent"]

    def model_calls(self, agent: str, session_id: str) -> int:
        lines = self.calls_log.read_text().splitlines() if self.calls_log.exists() else []
        return sum(1 for line in lines if line.split() == [agent, session_id])


@asynccontextmanager
async def mesh_on(store: str, *, depth: int = 2) -> AsyncIterator[Mesh]:
    """The services up on ``store`` (sqlite, redis or postgres); data dropped afterwards."""
    with tempfile.TemporaryDirectory(prefix="helix-crash-") as tmp:
        mesh = Mesh(Path(tmp), store, depth)
        try:
            await asyncio.gather(*(service.start() for service in mesh.services.values()))
            yield mesh
        finally:
            await asyncio.gather(*(service.stop() for service in mesh.services.values()))
            for url in mesh.urls.values():
                await drop_store_data(store, url)


async def _read(
    client: AgentClient, session_id: str, *, after: int, until: int | None
) -> list[pb.StreamEvent]:
    """A session's events after ``after``; with ``until``, stop at that sequence."""
    events: list[pb.StreamEvent] = []
    async for event in client.stream(session_id, from_sequence=after):
        events.append(event)
        if until is not None and event.sequence >= until:
            break
    return events


async def reference_run(mesh: Mesh) -> list[str]:
    """The kinds of an undisturbed delegation's parent events, in order."""
    wanted, root = tree(f"ref-{uuid.uuid4().hex[:8]}", mesh.depth)
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(wanted, session_id=root.session_id)
        events = await _read(client, root.session_id, after=0, until=None)
    outcome = Outcome(Case("none", 0))
    await _check(mesh, root, events, outcome, kills={})
    if outcome.violations:
        raise AssertionError(f"an undisturbed run broke the invariants: {outcome.violations}")
    return [_kind(e) for e in events]


async def run_case(mesh: Mesh, case: Case) -> Outcome:
    """One kill, one restart, then the invariants (violations are returned, not raised)."""
    wanted, root = tree(f"crash-{case.at}-{uuid.uuid4().hex[:8]}", mesh.depth)
    outcome = Outcome(case)
    roles = case.victim.split("+")
    victims = [mesh.services[role] for role in roles]
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(wanted, session_id=root.session_id)
        events = await _read(client, root.session_id, after=0, until=case.at)
        outcome.killed_after = _kind(events[-1]) if events else "nothing"
        killed = time.monotonic()
        for _ in range(1 + case.again):
            await asyncio.gather(*(victim.kill() for victim in victims))
            await asyncio.sleep(case.down_s)
            await asyncio.gather(*(victim.start() for victim in victims))
        last = events[-1].sequence if events else 0
        async with asyncio.timeout(60):
            events += await _read(client, root.session_id, after=last, until=None)
        outcome.done_s = time.monotonic() - killed
    await _check(mesh, root, events, outcome, kills={role: 1 + case.again for role in roles})
    return outcome


async def _check(
    mesh: Mesh, root: Node, events: list[pb.StreamEvent], outcome: Outcome, *, kills: dict[str, int]
) -> None:
    """The root as the client saw it live, then every session of the tree."""
    async with await AgentClient.connect(mesh.parent.address) as client:
        replay = await _read(client, root.session_id, after=0, until=None)
    # As messages, not bytes: protobuf does not fix the order of a map's entries on the
    # wire (a forwarded child's `run_started.metadata`), so equal events may encode apart.
    if replay != events:
        outcome.violations.append("parent: a replay from 0 differs from what was sent live")
    await _check_session(mesh, root, events, outcome.violations, kills=kills)


async def _check_session(
    mesh: Mesh,
    node: Node,
    events: list[pb.StreamEvent],
    problems: list[str],
    *,
    kills: dict[str, int],
) -> None:
    """One session's log (gapless, one run, the right end), its model calls (each made
    once, but for one more per kill of its service), and each child's log forwarded once."""
    name = f"{node.role} {node.session_id}"
    kinds = [_kind(e) for e in events]
    if [e.sequence for e in events] != list(range(1, len(events) + 1)):
        problems.append(f"{name}: gap or repeat in {[e.sequence for e in events]}")
    if kinds.count("run_started") != 1 or kinds[-1:] != ["completed"]:
        problems.append(f"{name}: {kinds.count('run_started')} run_started, ends {kinds[-1:]}")
    outputs = [json.loads(e.output.output_json) for e in events if _kind(e) == "output"]
    if outputs != [node.output]:
        problems.append(f"{name}: output {outputs}")
    calls = mesh.model_calls(node.model, node.session_id)
    if not node.calls <= calls <= node.calls + kills.get(node.role, 0):
        problems.append(f"{name}: {calls} model calls (undisturbed: {node.calls})")
    for call_id, child in node.children:
        forwarded = [
            e.child_event.event
            for e in events
            if _kind(e) == "child_event" and e.child_event.tool_call_id == call_id
        ]
        async with await AgentClient.connect(mesh.services[child.role].address) as client:
            own = await _read(client, child.session_id, after=0, until=None)
        if forwarded != own:  # as messages: map entries have no fixed byte order
            problems.append(f"{name}: forwarded {len(forwarded)} of {call_id}'s {len(own)} events")
        await _check_session(mesh, child, own, problems, kills=kills)


def spread(last: int, samples: int) -> list[int]:
    """``samples`` sequences spread over 1..last, both ends included (all if fewer; one
    sample is the middle)."""
    if samples >= last:
        return list(range(1, last + 1))
    if samples == 1:
        return [(last + 1) // 2]
    return sorted({1 + round(i * (last - 1) / (samples - 1)) for i in range(samples)})


def kill_points(kinds: Sequence[str], *, samples: int, boundaries: bool) -> list[int]:
    """Where to kill, by the parent's sequence: ``samples`` spread over the run and, with
    ``boundaries``, after each of the parent's own events (its steps and model calls, its
    tools' and children's starts and ends). None after the last step's start: that step
    (the closing model call, then ``__finish__``) writes the rest with the end in one go."""
    last = len(kinds) - kinds[::-1].index("step_started")
    points = set(spread(last, samples))
    if boundaries:
        points |= {seq for seq, kind in enumerate(kinds[:last], 1) if kind != "child_event"}
    return sorted(points)


def cases(
    points: Sequence[int],
    *,
    depth: int = 2,
    downs: Sequence[float] = (0.0,),
    again: Sequence[bool] = (False,),
) -> list[Case]:
    return [
        Case(victim, at, down, twice)
        for twice in again
        for down in downs
        for victim in victims(depth)
        for at in points
    ]


async def run_matrix(
    store: str,
    *,
    samples: int,
    depth: int = 2,
    boundaries: bool = True,
    downs: Sequence[float] = (0.0,),
    again: Sequence[bool] = (False,),
    out: list[Outcome] | None = None,
) -> list[Outcome]:
    """Every case on one backend, printed as it ends; violations are in the outcomes."""
    outcomes = [] if out is None else out
    async with mesh_on(store, depth=depth) as mesh:
        points = kill_points(await reference_run(mesh), samples=samples, boundaries=boundaries)
        for case in cases(points, depth=depth, downs=downs, again=again):
            outcome = await run_case(mesh, case)
            outcomes.append(outcome)
            status = "ok" if not outcome.violations else "; ".join(outcome.violations)
            print(
                f"{store:8} {case!s:28} after {outcome.killed_after:14} "
                f"done {outcome.done_s:5.2f} s after the kill  {status}",
                flush=True,
            )
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--store", default="sqlite", help="sqlite, redis, postgres (comma-separated)"
    )
    parser.add_argument("--depth", type=int, choices=(2, 3), default=2, help="levels of services")
    parser.add_argument("--samples", type=int, default=6, help="kill points spread over the run")
    parser.add_argument(
        "--no-boundaries", action="store_true", help="not after each of the parent's own events"
    )
    parser.add_argument("--down", default="0,1.5", help="seconds each victim stays down")
    parser.add_argument("--once", action="store_true", help="no case killed again mid-recovery")
    args = parser.parse_args(argv)
    outcomes: list[Outcome] = []
    for store in args.store.split(","):
        matrix = run_matrix(
            store,
            samples=args.samples,
            depth=args.depth,
            boundaries=not args.no_boundaries,
            downs=[float(d) for d in args.down.split(",")],
            again=(False,) if args.once else (False, True),
            out=outcomes,
        )
        asyncio.run(matrix)
    failed = [o for o in outcomes if o.violations]
    print(f"{len(outcomes)} cases, {len(failed)} with violations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
