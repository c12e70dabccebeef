"""``helix-mesh respond``: answer a request for input from a script.

    helix-mesh respond ADDRESS SESSION REQUEST --approve [--reason TEXT]
    helix-mesh respond ADDRESS SESSION REQUEST --result '{"sent": true}'

Without ``--path`` the request's path is found by replaying SESSION's log up to
where ``GetStatus`` says it is, and folding it (``answer.locate``).
"""

from __future__ import annotations

import argparse
import json

from helix_transport._exceptions import UsageError
from helix_transport.agent.inputs import Answer
from helix_transport.cli.answer import locate, outcome_text, submit
from helix_transport.cli.client import connect
from helix_transport.cli.exits import ExitCode
from helix_transport.cli.flags import client_options
from helix_transport.cli.follow import session_events
from helix_transport.cli.jsonout import dumps, message_json
from helix_transport.transport import AgentClient
from helix_transport.tree import SessionTree


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``respond`` to ``sub`` (an ``add_subparsers`` result)."""
    respond_ = sub.add_parser(
        "respond",
        help="answer a request for input (an approval, a client tool's result)",
        description="Answer a request for input waiting in SESSION's tree; the answer "
        "goes to SESSION's service, which passes it down to the session that asked.",
    )
    respond_.add_argument("address", help="the service of SESSION (normally the root's)")
    respond_.add_argument("session_id", metavar="SESSION", help="the session you hold")
    respond_.add_argument("request_id", metavar="REQUEST", help="the request's id")
    answer = respond_.add_mutually_exclusive_group(required=True)
    answer.add_argument("--approve", action="store_true", help="approve the call: it runs")
    answer.add_argument("--deny", action="store_true", help="deny it: the model sees why")
    answer.add_argument("--result", metavar="JSON", help="a client tool's result")
    answer.add_argument("--error", metavar="TEXT", help="a client tool's failure")
    respond_.add_argument("--reason", default="", help="why (with --approve or --deny)")
    respond_.add_argument(
        "--path",
        nargs="+",
        action="extend",
        metavar="ID",
        help="session ids from SESSION down to the one that asked "
        "(default: found in SESSION's log)",
    )
    respond_.add_argument("--json", action="store_true", help="print the outcome as JSON")
    client_options(respond_)


def answer_of(args: argparse.Namespace) -> Answer:
    """The answer the flags give.

    Raises:
        UsageError: ``--reason`` without an approval, or ``--result`` that is not JSON.
    """
    if args.approve or args.deny:
        return Answer(approved=bool(args.approve), reason=args.reason)
    if args.reason:
        raise UsageError(
            "--reason goes with --approve or --deny (a client tool's failure: --error)"
        )
    if args.error is not None:
        if not args.error.strip():
            raise UsageError("--error: say what failed (the model reads it)")
        return Answer(error=args.error)
    try:
        json.loads(args.result)
    except ValueError as exc:
        raise UsageError(f"--result: not JSON ({exc})") from None
    return Answer(result_json=args.result)


async def find_path(client: AgentClient, session_id: str, request_id: str) -> tuple[str, ...]:
    """The path of ``request_id`` from ``session_id`` on, from the log as far as it went
    when asked (see ``answer.locate``)."""
    status = await client.get_status(session_id)
    tree = SessionTree()
    async for event in session_events(client, session_id, until_sequence=status.last_sequence):
        tree.add(event)
    return locate(tree, session_id, request_id)


async def respond(args: argparse.Namespace) -> int:
    """Send the answer; exit 0 once the service recorded it (or had it already)."""
    answer = answer_of(args)
    async with await connect(args) as client:
        path = tuple(args.path or ()) or await find_path(client, args.session_id, args.request_id)
        reply = await submit(client, args.session_id, args.request_id, answer, path=path)
    if args.json:
        shown = {
            "session_id": args.session_id,
            "request_id": args.request_id,
            "path": list(path),
            "answer": answer_json(answer),
            **message_json(reply),
        }
        print(dumps(shown))
    else:
        print(outcome_text(args.request_id, answer, reply))
    return ExitCode.COMPLETED


def answer_json(answer: Answer) -> dict[str, object]:
    """The answer as ``--json`` shows it: the fields the flags set, a result parsed."""
    if answer.approved is not None:
        return {"approved": answer.approved, "reason": answer.reason}
    if answer.error is not None:
        return {"error": answer.error}
    return {"result": json.loads(answer.result_json or "null")}
