"""The crash matrix: SIGKILL a delegation's processes at every point of its run.

    python -m tests.crash.matrix [--store sqlite,redis,postgres] [--samples 6] [--down 0,1.5]

A parent service (``delegator``) delegates to two children on a child service
(``counter``), each a real ``helix-mesh serve`` process. For each case the client
starts a fresh root session, reads the parent's stream until it has seen the event
with the case's sequence, SIGKILLs the case's victim (the child's service, the
parent's, or both), leaves it down for ``down_s`` and restarts it on the same port
and store (in some cases killing it again as soon as it serves, mid-recovery), then
reads on from the last sequence it saw. The points come from an undisturbed run: after
each of the parent's own events (so kills land before the children start, between a
child's end and the parent's, in the parent's closing model call) and spread over the
children's streaming.

Every case must hold the same invariants, whatever the point:

- the client's view of the parent's log is gapless from 1 and ends ``completed`` with
  the right output, and a replay from 0 returns exactly those bytes;
- each child's events appear in the parent's log once each, in order, byte for byte
  its own log, which has one ``run_started`` and ends ``completed`` with the right output;
- nothing ran twice that was not in flight: a child whose service was not killed made
  exactly its ``steps + 1`` model calls (a killed one at most one more), and the parent
  made its 2 (at most 3 if it was killed: the step it was in may be asked again).

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
from typing import Literal

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench.streams import drop_store_data, store_url
from helix_transport.remote import child_session_id
from helix_transport.testing.processes import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parents[2]

Victim = Literal["child", "parent", "both"]
VICTIMS: tuple[Victim, ...] = ("child", "parent", "both")

CHILDREN = ({"steps": 3, "words": 3}, {"steps": 4, "words": 2})
INPUT = json.dumps({"calls": [{"tool": "count", "args": args} for args in CHILDREN]})
OUTPUT = {"results": [{"total": c["steps"], "steps": c["steps"]} for c in CHILDREN]}
CALL_IDS = tuple(f"call_1_{i}" for i in range(len(CHILDREN)))


@dataclass(frozen=True)
class Case:
    victim: Victim
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
    """The two services, on one store backend; each case uses its own root session."""

    def __init__(self, workdir: Path, store: str) -> None:
        self.workdir = workdir
        self.store = store
        self.calls_log = workdir / "calls.log"
        # Each service its own store, as each team's would be.
        self.urls = {role: store_url(store, workdir, label=role) for role in ("parent", "child")}
        self.child = self._service("counter", port=free_port(), env={})
        self.parent = self._service(
            "delegator",
            port=free_port(),
            env={"HELIX_AGENT_ADDRESS_COUNTER": self.child.address},
        )

    def _service(self, agent: str, *, port: int, env: dict[str, str]) -> ServiceProcess:
        role = "child" if agent == "counter" else "parent"
        return ServiceProcess(
            f"tests.agents:{agent}",
            port=port,
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

    def victims(self, victim: Victim) -> list[ServiceProcess]:
        return {"child": [self.child], "parent": [self.parent], "both": [self.parent, self.child]}[
            victim
        ]

    def model_calls(self, agent: str, session_id: str) -> int:
        lines = self.calls_log.read_text().splitlines() if self.calls_log.exists() else []
        return sum(1 for line in lines if line.split() == [agent, session_id])


@asynccontextmanager
async def mesh_on(store: str) -> AsyncIterator[Mesh]:
    """Both services up on ``store`` (sqlite, redis or postgres); data dropped afterwards."""
    with tempfile.TemporaryDirectory(prefix="helix-crash-") as tmp:
        mesh = Mesh(Path(tmp), store)
        try:
            await asyncio.gather(mesh.child.start(), mesh.parent.start())
            yield mesh
        finally:
            await asyncio.gather(mesh.parent.stop(), mesh.child.stop())
            for url in mesh.urls.values():
                await drop_store_data(store, url)


async def _read(
    client: AgentClient, root: str, *, after: int, until: int | None
) -> list[pb.StreamEvent]:
    """The parent's events after ``after``; with ``until``, stop at that sequence."""
    events: list[pb.StreamEvent] = []
    async for event in client.stream(root, from_sequence=after):
        events.append(event)
        if until is not None and event.sequence >= until:
            break
    return events


async def reference_run(mesh: Mesh) -> list[str]:
    """The kinds of an undisturbed delegation's parent events, in order."""
    root = f"ref-{uuid.uuid4().hex[:8]}"
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(INPUT, session_id=root)
        events = await _read(client, root, after=0, until=None)
    outcome = Outcome(Case("parent", 0))
    await _check(mesh, root, events, outcome, kills={})
    if outcome.violations:
        raise AssertionError(f"an undisturbed run broke the invariants: {outcome.violations}")
    return [_kind(e) for e in events]


async def run_case(mesh: Mesh, case: Case) -> Outcome:
    """One kill, one restart, then the invariants (violations are returned, not raised)."""
    root = f"crash-{case.victim}-{case.at}-{uuid.uuid4().hex[:8]}"
    outcome = Outcome(case)
    victims = mesh.victims(case.victim)
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(INPUT, session_id=root)
        events = await _read(client, root, after=0, until=case.at)
        outcome.killed_after = _kind(events[-1]) if events else "nothing"
        killed = time.monotonic()
        for _ in range(1 + case.again):
            await asyncio.gather(*(victim.kill() for victim in victims))
            await asyncio.sleep(case.down_s)
            await asyncio.gather(*(victim.start() for victim in victims))
        last = events[-1].sequence if events else 0
        async with asyncio.timeout(60):
            events += await _read(client, root, after=last, until=None)
        outcome.done_s = time.monotonic() - killed
    await _check(mesh, root, events, outcome, kills={v: 1 + case.again for v in victims})
    return outcome


async def _check(
    mesh: Mesh,
    root: str,
    events: list[pb.StreamEvent],
    outcome: Outcome,
    *,
    kills: dict[ServiceProcess, int],
) -> None:
    problems = outcome.violations
    if [e.sequence for e in events] != list(range(1, len(events) + 1)):
        problems.append(f"parent: gap or repeat in {[e.sequence for e in events]}")
    if not events or _kind(events[-1]) != "completed":
        problems.append(f"parent: ends {_kind(events[-1]) if events else 'empty'}")
    outputs = [json.loads(e.output.output_json) for e in events if _kind(e) == "output"]
    if outputs != [OUTPUT]:
        problems.append(f"parent: output {outputs}")
    async with await AgentClient.connect(mesh.parent.address) as client:
        replay = await _read(client, root, after=0, until=None)
    if [e.SerializeToString() for e in replay] != [e.SerializeToString() for e in events]:
        problems.append("parent: a replay from 0 differs from what the client was sent live")

    async with await AgentClient.connect(mesh.child.address) as client:
        for call_id, args in zip(CALL_IDS, CHILDREN, strict=True):
            child = child_session_id(root, call_id)
            forwarded = [
                e.child_event.event
                for e in events
                if _kind(e) == "child_event" and e.child_event.tool_call_id == call_id
            ]
            own = await _read(client, child, after=0, until=None)
            kinds = [_kind(e) for e in own]
            if [e.SerializeToString() for e in forwarded] != [e.SerializeToString() for e in own]:
                problems.append(f"{call_id}: forwarded {len(forwarded)} events, own log {len(own)}")
            if kinds.count("run_started") != 1 or kinds[-1:] != ["completed"]:
                problems.append(
                    f"{call_id}: own log {kinds.count('run_started')} run_started, ends {kinds[-1:]}"
                )
            calls = mesh.model_calls("counter", child)
            most = args["steps"] + 1 + kills.get(mesh.child, 0)
            if not args["steps"] + 1 <= calls <= most:
                problems.append(
                    f"{call_id}: {calls} model calls (expected {args['steps'] + 1}..{most})"
                )
    parent_calls = mesh.model_calls("delegate", root)
    if not 2 <= parent_calls <= 2 + kills.get(mesh.parent, 0):
        problems.append(f"parent: {parent_calls} model calls")


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
    points: Sequence[int], *, downs: Sequence[float], again: Sequence[bool] = (False,)
) -> list[Case]:
    return [
        Case(victim, at, down, twice)
        for twice in again
        for down in downs
        for victim in VICTIMS
        for at in points
    ]


async def run_matrix(
    store: str,
    *,
    samples: int,
    boundaries: bool = True,
    downs: Sequence[float] = (0.0,),
    again: Sequence[bool] = (False,),
    out: list[Outcome] | None = None,
) -> list[Outcome]:
    """Every case on one backend, printed as it ends; violations are in the outcomes."""
    outcomes = [] if out is None else out
    async with mesh_on(store) as mesh:
        points = kill_points(await reference_run(mesh), samples=samples, boundaries=boundaries)
        for case in cases(points, downs=downs, again=again):
            outcome = await run_case(mesh, case)
            outcomes.append(outcome)
            status = "ok" if not outcome.violations else "; ".join(outcome.violations)
            print(
                f"{store:8} {case!s:20} after {outcome.killed_after:14} "
                f"done {outcome.done_s:5.2f} s after the kill  {status}",
                flush=True,
            )
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--store", default="sqlite", help="sqlite, redis, postgres (comma-separated)"
    )
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
