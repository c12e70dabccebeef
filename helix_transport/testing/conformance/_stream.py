"""The checks of ``Stream`` on the main session: readers agree, the log is gapless, a
reader resumes mid-run, replays from anywhere, a stream past the end ends with the run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from helix_transport._events import TERMINAL_KINDS
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import (
    BEYOND_THE_END,
    SESSION_CHECKS,
    Failed,
    Skipped,
    gapless,
    json_equal,
    kind,
    require,
    wire,
)
from helix_transport.testing.conformance._follow import check_follow
from helix_transport.testing.conformance._kit import Kit, LongPoll, Read


@dataclass
class MainRun:
    """What the kit saw of its main session while it ran; every later check judges it."""

    session_id: str
    poll_task: asyncio.Task[LongPoll]
    """A long poll of the session sent while it ran (when it still did)."""
    beyond_task: asyncio.Task[Read]
    """A stream opened past the end of the log while it grew."""
    first: Read
    second: Read
    """Two readers from the start, at once."""
    partial: Read
    """A reader that left after a few events..."""
    rest: Read
    """...and came back from its last sequence (empty when it never left)."""
    running_at_return: bool

    @property
    def log(self) -> list[pb.StreamEvent]:
        return self.first.events

    @property
    def terminal(self) -> pb.StreamEvent:
        """The log's terminal event (once ``stream.concurrent_readers`` passed)."""
        return self.log[-1]


async def observe(kit: Kit, session_id: str) -> MainRun:
    """Read the main session while it runs, as several readers and a poller at once."""
    # A long poll of the session while it runs (when it still does), two readers
    # from the start, and one that leaves after a few events and comes back from
    # its last sequence (mid-run when the run is slow enough).
    poll_task = asyncio.create_task(kit.long_poll(session_id, timing.WAIT_RUNNING_S))
    # Past the end of the log while it grows: must end when the session does.
    beyond_task = asyncio.create_task(kit.read(session_id, BEYOND_THE_END))
    first_task = asyncio.create_task(kit.read(session_id))
    second_task = asyncio.create_task(kit.read(session_id))
    partial = await kit.read(session_id, leave_after=3)
    running_at_return = False
    if partial.end == "left":
        running_at_return = (await kit.status(session_id)).status == pb.SESSION_STATUS_RUNNING
        last = partial.events[-1].sequence
        rest = await kit.read(session_id, last)
    else:
        rest = Read()
    first, second = await first_task, await second_task
    return MainRun(
        session_id=session_id,
        poll_task=poll_task,
        beyond_task=beyond_task,
        first=first,
        second=second,
        partial=partial,
        rest=rest,
        running_at_return=running_at_return,
    )


async def check_streams(kit: Kit, run: MainRun) -> bool:
    """The stream checks; False when the readers saw no complete log (nothing else runs)."""
    if not await kit.check("stream.concurrent_readers", lambda: _readers(run)):
        run.poll_task.cancel()
        run.beyond_task.cancel()
        # Every later check of this session needs its complete log.
        skipped = SESSION_CHECKS[SESSION_CHECKS.index("stream.gapless") : -1]
        kit.not_run(skipped, "no complete log (see concurrent_readers)")
        return False
    await kit.check("stream.gapless", lambda: _gapless(kit, run))
    await kit.check("stream.ends_after_terminal", lambda: _ends(run))
    await kit.check("stream.resume_mid_run", lambda: _resume(run))
    await kit.check("stream.replay", lambda: _replay(kit, run))
    await kit.check("stream.beyond_the_end", lambda: _beyond(run))
    await kit.check("stream.follow", lambda: check_follow(kit, run.log, run.session_id))
    return True


async def _readers(run: MainRun) -> str:
    run.first.require_complete("first reader")
    run.second.require_complete("second reader")
    require(
        wire(run.first.events) == wire(run.second.events),
        f"two readers at once saw different logs ({len(run.first.events)} and "
        f"{len(run.second.events)} events)",
    )
    return f"two concurrent readers from 0 saw the same {len(run.log)} events"


async def _gapless(kit: Kit, run: MainRun) -> str:
    log = run.log
    require(not (gap := gapless(log)), gap)
    kinds = [kind(e) for e in log]
    require(kinds[0] == "run_started", f"the first event is {kinds[0]!r}, not run_started")
    require(kinds.count("run_started") == 1, "run_started appears more than once")
    terminals = [k for k in kinds if k in TERMINAL_KINDS]
    require(len(terminals) == 1, f"{len(terminals)} terminal events: {terminals}")
    for event in log:
        require(
            event.session_id == run.session_id and event.agent_type == kit.agent_type,
            f"event {event.sequence} carries session_id {event.session_id!r} and "
            f"agent_type {event.agent_type!r}",
        )
        require(event.time.seconds > 0, f"event {event.sequence} has no time")
        require(event.step >= 0, f"event {event.sequence} has step {event.step}")
    require(
        json_equal(log[0].run_started.input_json, kit.input_json),
        f"run_started.input_json {log[0].run_started.input_json!r} is not the input",
    )
    return f"sequences 1..{len(log)}, run_started first, {kinds[-1]} last"


async def _ends(run: MainRun) -> str:
    return f"ended cleanly right after the {kind(run.terminal)} event"


async def _resume(run: MainRun) -> str:
    partial, rest = run.partial, run.rest
    if partial.end != "left":
        partial.require_complete("the leaving reader")
        raise Skipped(
            f"the session ended within {len(partial.events)} event(s); no mid-run reconnect"
        )
    rest.require_complete("the returning reader")
    require(
        wire(partial.events + rest.events) == wire(run.log),
        f"left after sequence {partial.events[-1].sequence}, came back with "
        f"from_sequence={partial.events[-1].sequence} and got "
        f"{[e.sequence for e in rest.events][:20]}...: not the rest of the log",
    )
    when = "while the session ran" if run.running_at_return else "after the session ended"
    return f"left after {len(partial.events)} events, resumed {when}, nothing lost or repeated"


async def _replay(kit: Kit, run: MainRun) -> str:
    log, session_id = run.log, run.session_id
    last = log[-1].sequence
    middle = last // 2
    whole = await kit.read(session_id, 0)
    whole.require_complete("replay from 0")
    require(wire(whole.events) == wire(log), "replay from 0 differs from the live log")
    half = await kit.read(session_id, middle)
    half.require_complete(f"replay from {middle}")
    require(
        wire(half.events) == wire(log[middle:]),
        f"replay from {middle} sent {[e.sequence for e in half.events][:20]}, "
        f"not {middle + 1}..{last}",
    )
    slowest = 0.0
    for position in (last, last + 10):
        started = time.monotonic()
        tail = await kit.read(session_id, position)
        slowest = max(slowest, time.monotonic() - started)
        require(
            not tail.events and tail.end == "ok",
            f"from_sequence={position} on the finished session: "
            f"{len(tail.events)} event(s), and the stream {tail.describe_end()} "
            "(it must end, promptly, with none)",
        )
    return (
        f"from 0, {middle} and {last}: the same log; at/past the end: no event, "
        f"ended within {slowest:.2f}s"
    )


async def _beyond(run: MainRun) -> str:
    try:
        far = await asyncio.wait_for(asyncio.shield(run.beyond_task), timing.END_GRACE_S)
    except TimeoutError:
        run.beyond_task.cancel()
        raise Failed(
            f"a stream from from_sequence={BEYOND_THE_END}, opened as the session "
            f"ran, was still open {timing.END_GRACE_S:g}s after the session ended (it must "
            "end when the session does)"
        ) from None
    require(
        not far.events and far.end == "ok",
        f"a stream from from_sequence={BEYOND_THE_END}: {len(far.events)} event(s), "
        f"and it {far.describe_end()} (it must end with none)",
    )
    return f"from_sequence={BEYOND_THE_END}, opened as the session ran: ended with it"
