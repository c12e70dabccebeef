"""The client commands: ``call``, ``status``, ``interrupt`` and ``describe``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Iterator
from datetime import timedelta

from helix_transport._config import ClientConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.flags import client_auth, client_options, positive_seconds, seconds
from helix_transport.cli.printer import EventPrinter, proto_json, status_name
from helix_transport.transport import AgentClient

_SLOW_S = 2.0  # when `call` says it is still waiting for the service


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to ``sub`` (an ``add_subparsers`` result)."""
    call_ = sub.add_parser("call", help="start a session and stream its events")
    call_.add_argument("address")
    call_.add_argument("--input", default="{}", help="the input as JSON")
    call_.add_argument("--session-id", default="", help="choose the session id (idempotent)")
    call_.add_argument("--follow", action="store_true", help="only stream an existing session")
    call_.add_argument("--from-sequence", type=int, default=0)
    call_.add_argument("--json", action="store_true", help="print events as JSON lines")
    call_.add_argument(
        "--timeout", type=positive_seconds, default=10.0, help="seconds per unary call"
    )
    client_options(call_)

    status_ = sub.add_parser("status", help="show a session's status")
    status_.add_argument("address")
    status_.add_argument("session_id")
    status_.add_argument(
        "--wait",
        type=seconds,
        metavar="SECONDS",
        help="if the session is running, answer when it ends or after SECONDS (at most 60)",
    )
    client_options(status_)

    interrupt_ = sub.add_parser("interrupt", help="interrupt a running session")
    interrupt_.add_argument("address")
    interrupt_.add_argument("session_id")
    interrupt_.add_argument("--reason", default="")
    client_options(interrupt_)

    describe_ = sub.add_parser("describe", help="show an agent's type and schemas")
    describe_.add_argument("address")
    client_options(describe_)


async def _connect(args: argparse.Namespace, config: ClientConfig | None = None) -> AgentClient:
    return await AgentClient.connect(
        args.address, config=config or ClientConfig.default, auth=client_auth(args)
    )


@contextlib.contextmanager
def _say_if_slow(message: str, *, after_s: float = _SLOW_S) -> Iterator[None]:
    """Print ``message`` on stderr if the block is still running after ``after_s``:
    the client retries an unreachable service for its whole reconnect deadline (30 s),
    which would otherwise look like a hang."""
    handle = asyncio.get_running_loop().call_later(
        after_s, lambda: print(f"helix-mesh: {message}", file=sys.stderr, flush=True)
    )
    try:
        yield
    finally:
        handle.cancel()


def _deadline_s(deadline: timedelta | None) -> float:
    return math.inf if deadline is None else deadline.total_seconds()


async def call(args: argparse.Namespace) -> int:
    """Start a session (or follow one) and print its events: 0 if it completed."""
    config = ClientConfig(rpc_timeout=timedelta(seconds=args.timeout))
    waiting = (
        f"{args.address} is not serving yet (not listening, starting or draining); "
        f"retrying for up to {_deadline_s(config.reconnect.deadline):g} s (Ctrl-C stops)"
    )
    async with await _connect(args, config) as client:
        session_id = args.session_id
        if args.follow:
            # Fails at once, as `status` does, where nothing listens or no such session
            # is: the stream would retry the first for 30 s, and its first event may
            # rightly be long in coming.
            await client.get_status(session_id)
        else:
            with _say_if_slow(waiting):
                started = await client.start(args.input, session_id=session_id)
            session_id = started.session_id
            if not started.created and args.session_id:  # a chosen id, not our own retry
                print(f"(session {session_id} already existed; streaming it)", file=sys.stderr)
        printer = EventPrinter()
        final: pb.StreamEvent | None = None
        async for event in client.stream(session_id, from_sequence=args.from_sequence):
            if args.json:
                print(proto_json(event, indent=None), flush=True)
            else:
                printer.print(event)
            final = event
        printer.close()
        kind = final.WhichOneof("payload") if final is not None else None
        if kind == "completed" and not args.json:
            print(json.dumps(json.loads(final.completed.output_json), indent=2))  # type: ignore[union-attr]
        return 0 if kind in ("completed", None) else 1


async def status(args: argparse.Namespace) -> int:
    """Print a session's status as JSON."""
    wait = None if args.wait is None else timedelta(seconds=args.wait)
    async with await _connect(args) as client:
        print(proto_json(await client.get_status(args.session_id, wait=wait)))
    return 0


async def interrupt(args: argparse.Namespace) -> int:
    """Interrupt a session and say whether that changed anything."""
    async with await _connect(args) as client:
        result = await client.interrupt(args.session_id, reason=args.reason)
    state = "interrupt recorded" if result.accepted else "already finished; nothing changed"
    print(f"{args.session_id}: {status_name(result.status)} ({state})")
    return 0


async def describe(args: argparse.Namespace) -> int:
    """Print the agent's type and schemas as JSON."""
    async with await _connect(args) as client:
        print(proto_json(await client.describe()))
    return 0
