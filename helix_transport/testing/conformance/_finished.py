"""The checks of the main session once it ended: its outcome, ``GetStatus`` (plain and
the ``wait`` long poll), and ``Start`` and ``Interrupt`` of a finished session."""

from __future__ import annotations

import time

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import (
    TERMINAL_STATUS,
    Failed,
    Skipped,
    json_equal,
    kind,
    require,
    status_name,
    waiting,
    wire,
)
from helix_transport.testing.conformance._kit import Kit, LongPoll
from helix_transport.testing.conformance._stream import MainRun


async def check_finished(kit: Kit, run: MainRun) -> None:
    await kit.check("session.completed", lambda: _completed(run))
    await kit.check("status.finished", lambda: _status(kit, run))
    await kit.check("status.wait_finished", lambda: _wait_finished(kit, run))
    await kit.check("status.wait_running", lambda: _wait_running(kit, run))
    await kit.check("start.after_finish", lambda: _again(kit, run))
    await kit.check("interrupt.finished", lambda: _finished_interrupt(kit, run))


def _agrees(run: MainRun, reply: pb.GetStatusResponse) -> bool:
    return (
        reply.status == TERMINAL_STATUS[kind(run.terminal)]
        and reply.last_sequence == run.terminal.sequence
    )


def _disagreement(run: MainRun, what: str, reply: pb.GetStatusResponse) -> str:
    terminal = run.terminal
    return (
        f"{what} answered {status_name(reply.status)} at sequence "
        f"{reply.last_sequence}, but the log ends {kind(terminal)} at {terminal.sequence}"
    )


async def _completed(run: MainRun) -> str:
    terminal = run.terminal
    require(
        kind(terminal) == "completed",
        f"the valid input ended {kind(terminal)}: "
        f"{terminal.failed.error if kind(terminal) == 'failed' else ''}",
    )
    outputs = [e for e in run.log if kind(e) == "output"]
    if outputs:
        require(
            json_equal(outputs[-1].output.output_json, terminal.completed.output_json),
            "the output event and completed.output_json differ",
        )
    return f"completed with output {terminal.completed.output_json[:80]}"


async def _status(kit: Kit, run: MainRun) -> str:
    terminal = run.terminal
    reply = await kit.status(run.session_id)
    expected = TERMINAL_STATUS[kind(terminal)]
    require(reply.session_id == run.session_id, f"session_id {reply.session_id!r}")
    require(reply.agent_type == kit.agent_type, f"agent_type {reply.agent_type!r}")
    require(
        reply.status == expected,
        f"status {status_name(reply.status)}, but the log ends {kind(terminal)}",
    )
    require(
        reply.last_sequence == terminal.sequence,
        f"last_sequence {reply.last_sequence}, but the terminal event is {terminal.sequence}",
    )
    if expected == pb.SESSION_STATUS_COMPLETED:
        require(
            json_equal(reply.output_json, terminal.completed.output_json),
            f"output_json {reply.output_json!r} is not completed.output_json",
        )
    if expected == pb.SESSION_STATUS_FAILED:
        require(bool(reply.error), "a failed session's status has no error")
    created, updated = reply.created_at.ToNanoseconds(), reply.updated_at.ToNanoseconds()
    finished = reply.finished_at.ToNanoseconds()
    require(created > 0, "created_at is not set")
    require(updated >= created, "updated_at is not set or before created_at")
    require(finished >= created, "finished_at is not set (or before created_at)")
    require(reply.parent_session_id == "", "a root session has a parent_session_id")
    usage = reply.usage
    require(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        "usage.total_tokens != prompt_tokens + completion_tokens",
    )
    return (
        f"{status_name(reply.status)}, last_sequence {reply.last_sequence}, "
        f"step_count {reply.step_count}, timestamps set"
    )


async def _wait_finished(kit: Kit, run: MainRun) -> str:
    # Whether the service implements wait or not, a finished session's long
    # poll has nothing to wait for.
    what = f"GetStatus with wait={timing.WAIT_FINISHED_S:g}s of the finished session"
    started = time.monotonic()
    try:
        reply = await kit.stub.GetStatus(
            waiting(run.session_id, timing.WAIT_FINISHED_S), timeout=timing.WAIT_PROMPT_S
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        raise Failed(
            f"{what} did not answer within {timing.WAIT_PROMPT_S:g}s (it must answer at once)"
        ) from None
    took = time.monotonic() - started
    require(_agrees(run, reply), _disagreement(run, what, reply))
    return (
        f"wait={timing.WAIT_FINISHED_S:g}s: {status_name(reply.status)} at sequence "
        f"{reply.last_sequence}, answered in {took:.2f}s"
    )


async def _wait_running(kit: Kit, run: MainRun) -> str:
    poll = await run.poll_task
    what = f"GetStatus with wait={poll.wait_s:g}s of the running session"
    if poll.error is not None:
        if poll.running and poll.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise Failed(
                f"{what} did not answer within {poll.wait_s + timing.END_GRACE_S:g}s "
                "(the wait plus END_GRACE_S)"
            )
        raise poll.error
    if not poll.running or poll.reply is None:
        raise Skipped("the session had ended before the kit could poll it running")
    # When the log's end reached a reader; the server logged it no later.
    ended = min(t for t in (run.first.terminal_at, run.second.terminal_at) if t is not None)
    if poll.reply.status != pb.SESSION_STATUS_RUNNING:
        return _ended_reply(kit, run, poll, what, ended)
    return _running_reply(kit, run, poll, what, ended)


def _ended_reply(kit: Kit, run: MainRun, poll: LongPoll, what: str, ended: float) -> str:
    """The running session's long poll answered a terminal status."""
    assert poll.reply is not None
    reply, took, late = poll.reply, poll.took, poll.answered - ended
    require(_agrees(run, reply), _disagreement(run, what, reply))
    require(
        poll.answered <= min(poll.sent + poll.wait_s, ended) + timing.END_GRACE_S,
        f"{what} answered {status_name(reply.status)} after {took:.2f}s, "
        f"{late:.2f}s after the log's terminal event reached a reader (it must "
        "answer when the session ends or the wait has passed)",
    )
    if took >= poll.wait_s / 2:
        kit.wait_honoured = True
        kit.wait_evidence = f"held a running session's reply {took:.2f}s"
    return (
        f"answered {status_name(reply.status)} at sequence {reply.last_sequence} "
        f"(the log's end) after {took:.2f}s"
    )


def _running_reply(kit: Kit, run: MainRun, poll: LongPoll, what: str, ended: float) -> str:
    """The running session's long poll answered RUNNING."""
    assert poll.reply is not None
    reply, took, late, wait_s = poll.reply, poll.took, poll.answered - ended, poll.wait_s
    terminal = run.terminal
    require(
        reply.last_sequence <= terminal.sequence,
        f"{what} answered RUNNING at sequence {reply.last_sequence}, past the log's "
        f"terminal event {terminal.sequence}",
    )
    require(
        late <= timing.END_GRACE_S,
        f"{what} answered RUNNING after {took:.2f}s, {late:.2f}s after the log's "
        "terminal event reached a reader (the session had ended)",
    )
    if took < wait_s / 2:
        kit.wait_honoured = False
        kit.wait_evidence = f"answered a running session RUNNING after {took:.2f}s"
        return (
            f"answered RUNNING at once ({took:.2f}s): the service does not implement "
            "wait (its callers must pace their polls)"
        )
    require(
        took >= wait_s * 0.9,
        f"{what} answered RUNNING after {took:.2f}s: neither at once (wait not "
        "implemented) nor once the wait had passed",
    )
    kit.wait_honoured = True
    kit.wait_evidence = f"held a running session's reply {took:.2f}s"
    return (
        f"held the reply {took:.2f}s, then answered RUNNING at sequence "
        f"{reply.last_sequence}; the session ended later"
    )


async def _again(kit: Kit, run: MainRun) -> str:
    terminal = run.terminal
    reply = await kit.start(kit.input_json, run.session_id)
    require(not reply.created, "Start of a finished session returned created=true")
    require(
        reply.status == TERMINAL_STATUS[kind(terminal)],
        f"Start of a finished session says {status_name(reply.status)}",
    )
    after = await kit.status(run.session_id)
    require(
        after.last_sequence == terminal.sequence,
        f"the log grew to {after.last_sequence} events: the session ran again",
    )
    return "created=false, status terminal, the log unchanged"


async def _finished_interrupt(kit: Kit, run: MainRun) -> str:
    reply = await kit.interrupt(run.session_id, "conformance: already finished")
    expected = TERMINAL_STATUS[kind(run.terminal)]
    require(not reply.accepted, "Interrupt of a finished session returned accepted=true")
    require(
        reply.status == expected,
        f"Interrupt of a finished session says {status_name(reply.status)}, "
        f"not {status_name(expected)}",
    )
    after = await kit.status(run.session_id)
    require(after.status == expected, f"the status became {status_name(after.status)}")
    replay = await kit.read(run.session_id, 0)
    require(
        wire(replay.events) == wire(run.log),
        "the log changed after interrupting the finished session",
    )
    return f"accepted=false, status stays {status_name(expected)}, the log unchanged"
