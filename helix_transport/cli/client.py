"""The client commands: ``call``, ``status``, ``interrupt`` and ``describe``
(``respond`` is in ``respond.py``, the requests for input ``call`` shows in ``answer.py``).

Each returns its ``ExitCode`` (``exits.py``): a session's outcome where there is one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta

from helix_transport._config import ClientConfig
from helix_transport._events import TERMINAL_KINDS
from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.answer import RequestWatch
from helix_transport.cli.exits import ExitCode, for_status, for_terminal_kind
from helix_transport.cli.flags import client_auth, client_options, positive_seconds, seconds
from helix_transport.cli.follow import session_events
from helix_transport.cli.jsonout import dumps, message_json
from helix_transport.cli.printer import EventPrinter, status_name, wants_color
from helix_transport.cli.views import describe_text, status_text
from helix_transport.transport import AgentClient

_SLOW_S = 2.0  # when `call` says it is still waiting for the service


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to ``sub`` (an ``add_subparsers`` result)."""
    call_ = sub.add_parser("call", help="start a session and stream its events")
    call_.add_argument("address")
    call_.add_argument(
        "--input", default="{}", help="the input as JSON; - reads it from standard input"
    )
    call_.add_argument("--session-id", default="", help="choose the session id (idempotent)")
    call_.add_argument(
        "--follow", action="store_true", help="stream an existing session (every turn)"
    )
    call_.add_argument("--from-sequence", type=int, default=0)
    call_.add_argument("--json", action="store_true", help="print events as JSON lines")
    call_.add_argument(
        "--auto-approve",
        action="store_true",
        help="approve every approval request by itself (and say so), even on a terminal",
    )
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
    status_.add_argument(
        "--include-children",
        action="store_true",
        help="add the usage of every session below this one (asks their services)",
    )
    status_.add_argument("--json", action="store_true", help="print the status as JSON")
    client_options(status_)

    interrupt_ = sub.add_parser("interrupt", help="interrupt a running or suspended session")
    interrupt_.add_argument("address")
    interrupt_.add_argument("session_id")
    interrupt_.add_argument("--reason", default="")
    interrupt_.add_argument(
        "--abort",
        action="store_true",
        help="end it and its whole subtree as terminated, never to be resumed",
    )
    interrupt_.add_argument("--json", action="store_true", help="print the outcome as JSON")
    client_options(interrupt_)

    describe_ = sub.add_parser("describe", help="show an agent's type and schemas")
    describe_.add_argument("address")
    describe_.add_argument("--json", action="store_true", help="print the description as JSON")
    client_options(describe_)


async def connect(args: argparse.Namespace, config: ClientConfig | None = None) -> AgentClient:
    """A client for ``args.address`` with the command's credentials."""
    return await AgentClient.connect(
        args.address, config=config or ClientConfig.default, auth=client_auth(args)
    )


async def read_input(text: str, *, flag: str = "--input") -> str:
    """The input JSON of ``--input``: ``-`` reads standard input (off the event loop).
    Checked here, so a typo fails at once, even with the service out of reach.

    Raises:
        UsageError: the text is not JSON.
    """
    if text == "-":
        text = await asyncio.to_thread(sys.stdin.read)
    try:
        json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not JSON ({exc})") from None
    return text


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
    """Start a session (or follow one) and print its events; its outcome's exit code."""
    config = ClientConfig(rpc_timeout=timedelta(seconds=args.timeout))
    waiting = (
        f"{args.address} is not serving yet (not listening, starting or draining); "
        f"retrying for up to {_deadline_s(config.reconnect.deadline):g} s (Ctrl-C stops)"
    )
    input_json = "{}" if args.follow else await read_input(args.input)
    async with await connect(args, config) as client:
        session_id = args.session_id
        if args.follow:
            # Fails at once, as `status` does, where nothing listens or no such session
            # is: the stream would retry the first for 30 s, and its first event may
            # rightly be long in coming.
            await client.get_status(session_id)
        else:
            with _say_if_slow(waiting):
                started = await client.start(input_json, session_id=session_id)
            session_id = started.session_id
            if not started.created and args.session_id:  # a chosen id, not our own retry
                print(f"(session {session_id} already existed; streaming it)", file=sys.stderr)
        printer = EventPrinter()
        show: Callable[[pb.StreamEvent], None] = (
            (lambda event: print(dumps(message_json(event), indent=None), flush=True))
            if args.json
            else printer.print
        )
        # Requests for input: on a terminal ask for the answer, else say how to give it.
        mode = "auto" if args.auto_approve else "ask" if sys.stdin.isatty() else "hint"
        watch = RequestWatch(
            client, session_id, mode=mode, out=sys.stderr if args.json else sys.stdout
        )
        final: pb.StreamEvent | None = None
        try:
            # Every turn: `--follow` of a continued session shows them all.
            async for event in session_events(client, session_id, from_sequence=args.from_sequence):
                show(event)
                await watch.add(event)
                final = event
        finally:
            printer.close()
        kind = final.WhichOneof("payload") if final is not None else None
        if kind == "completed" and not args.json:
            print(json.dumps(json.loads(final.completed.output_json), indent=2))  # type: ignore[union-attr]
        if kind not in TERMINAL_KINDS:  # nothing after --from-sequence: ask how it stands
            return for_status((await client.get_status(session_id)).status)
        return for_terminal_kind(kind)


async def status(args: argparse.Namespace) -> int:
    """Print a session's status: exit 0 completed, 1 failed, 3 interrupted, 5 running."""
    wait = None if args.wait is None else timedelta(seconds=args.wait)
    async with await connect(args) as client:
        reply = await client.get_status(
            args.session_id, include_children=args.include_children, wait=wait
        )
    if args.json:
        shown = message_json(reply)
        if not args.include_children:
            del shown["total_usage"]  # without the flag it only repeats `usage`
        print(dumps(shown))
    else:
        color = wants_color(sys.stdout)
        print(status_text(reply, include_children=args.include_children, color=color))
    return for_status(reply.status)


async def interrupt(args: argparse.Namespace) -> int:
    """Interrupt a session and say whether that changed anything."""
    async with await connect(args) as client:
        result = await client.interrupt(args.session_id, reason=args.reason, abort=args.abort)
    if args.json:
        print(dumps({"session_id": args.session_id, "abort": args.abort, **message_json(result)}))
        return ExitCode.COMPLETED
    asked = "abort" if args.abort else "interrupt"
    state = f"{asked} recorded" if result.accepted else "already finished; nothing changed"
    print(f"{args.session_id}: {status_name(result.status)} ({state})")
    return ExitCode.COMPLETED


async def describe(args: argparse.Namespace) -> int:
    """Print the agent's type, tools and schemas."""
    async with await connect(args) as client:
        described = await client.describe()
    print(dumps(message_json(described)) if args.json else describe_text(described))
    return ExitCode.COMPLETED
