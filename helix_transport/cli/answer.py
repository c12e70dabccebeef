"""Requests for input, as ``call`` and ``respond`` show and answer them.

A request waits somewhere in the tree below the session the caller holds; the
answer goes to that session's service (``SubmitInput``), which passes it down the
request's ``path``. ``call`` folds the root's stream (``helix_transport.tree``) to
see each request as it appears and, on a terminal, asks the person at it
(``ask``); ``respond`` answers one from a script, finding its path by replaying
the log (``locate``).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Callable
from typing import TextIO

from helix_transport._exceptions import (
    InvalidArgument,
    SessionNotFound,
    SessionStateConflict,
    UsageError,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.inputs import Answer
from helix_transport.cli.printer import status_name
from helix_transport.transport import AgentClient
from helix_transport.tree import PendingRequest, SessionTree, rfc3339

AUTO_LABEL = "--auto-approve"
WAITING_TEXT = (
    "waiting for input: no terminal to ask on, so this call waits until the request is "
    "answered (the session stays suspended; Ctrl-C stops this call, not the session)"
)
"""What ``call`` says when it cannot ask: it waits, and the next line says how to answer."""


def answer_text(answer: Answer) -> str:
    """An answer as the CLI reports it: approved or denied (with the reason), a client
    tool's error, or its result."""
    if answer.approved is not None:
        said = "approved" if answer.approved else "denied"
        return said + (f" ({answer.reason})" if answer.reason else "")
    if answer.error is not None:
        return f"error: {answer.error}"
    return f"result {answer.result_json}"


def request_text(request: PendingRequest) -> str:
    """What a person reads about a request: the call, what is wanted, where, its id."""
    wanted = "approval" if request.kind == "approval" else "a result from you (client tool)"
    lines = [
        f"input required: {request.tool_name}({request.arguments_json}) needs {wanted}",
        f"  request {request.request_id}, asked by session {request.session_id}",
        f"  path {' > '.join(request.path) or request.session_id}",
    ]
    if request.deadline is not None:
        lines.append(f"  expires {rfc3339(request.deadline)}")
    return "\n".join(lines)


def respond_command(address: str, session_id: str, request: PendingRequest) -> str:
    """The ``helix-mesh respond`` line that answers ``request`` from a script. It names
    the path: a tool call id can repeat in a sibling that has not asked yet."""
    head = shlex.join(["helix-mesh", "respond", address, session_id, request.request_id])
    path = shlex.join(path_from(request.path, session_id))
    if request.kind == "approval":
        return f"{head} --approve|--deny [--reason TEXT] --path {path}"
    return f"{head} --result JSON|--error TEXT --path {path}"


async def ask(
    request: PendingRequest, *, read: Callable[[str], str] = input, out: TextIO = sys.stdout
) -> Answer | None:
    """Ask the person at the terminal; ``None`` when they give no answer (end of input).

    An approval: ``approve? [y/N]`` (anything but y/yes denies), then an optional
    reason. A client tool: its result as JSON, or ``!`` and an error text; asked again
    until it is JSON.
    """

    async def line(prompt: str) -> str | None:
        # Written here, not by input(): on a terminal input() writes it to stderr.
        print(prompt, end="", file=out, flush=True)
        try:
            return (await asyncio.to_thread(read, "")).strip()
        except EOFError:
            return None

    if request.kind == "approval":
        said = await line(f"approve {request.tool_name}? [y/N] ")
        if said is None:
            return None
        reason = await line("reason (optional, Enter for none): ")
        return Answer(approved=said.lower() in ("y", "yes"), reason=reason or "")
    while True:
        said = await line(f"result of {request.tool_name} as JSON (or !ERROR TEXT): ")
        if said is None:
            return None
        if said.startswith("!"):
            return Answer(error=said[1:].strip() or "failed")
        try:
            json.loads(said)
        except ValueError as exc:
            print(f"not JSON ({exc}); try again", file=out)
            continue
        return Answer(result_json=said)


def locate(tree: SessionTree, session_id: str, request_id: str) -> tuple[str, ...]:
    """The path (from ``session_id`` on) of the request ``request_id`` in ``tree``, the
    fold of ``session_id``'s log.

    A pending request wins; else a request answered already (so repeating an answer
    is the no-op it should be). Tool call ids repeat across sessions (each model
    numbers its own), so one asked by two sessions needs ``--path``.

    Raises:
        UsageError: no session of the tree asked it, or more than one did.
    """
    pending = [r for r in tree.pending_requests() if r.request_id == request_id]
    asked = pending or _ever_asked(tree, request_id)
    if not asked:
        raise UsageError(
            f"no request {request_id!r} in the tree of session {session_id!r} "
            "(not asked yet, or a wrong id: `helix-mesh tree` lists the pending ones)"
        )
    if len({r.session_id for r in asked}) > 1:
        paths = "; ".join(" ".join(r.path) for r in asked)
        raise UsageError(
            f"request {request_id!r} was asked by {len(asked)} sessions of the tree; "
            f"name one with --path (the paths: {paths})"
        )
    return path_from(asked[0].path, session_id)


def path_from(path: tuple[str, ...], session_id: str) -> tuple[str, ...]:
    """``path`` (from the root) from ``session_id`` on, as ``SubmitInput`` takes it
    from a session below the root; whole when it does not pass ``session_id``."""
    return path[path.index(session_id) :] if session_id in path else path


def _ever_asked(tree: SessionTree, request_id: str) -> list[PendingRequest]:
    if tree.root is None:
        return []
    return [
        PendingRequest.from_proto(node.session_id, event.input_required)
        for node in tree.root.walk()
        for event in node.events
        if event.WhichOneof("payload") == "input_required"
        and event.input_required.request_id == request_id
    ]


async def submit(
    client: AgentClient,
    session_id: str,
    request_id: str,
    answer: Answer,
    *,
    path: tuple[str, ...],
) -> pb.SubmitInputResponse:
    """Send ``answer`` to ``session_id``'s service (``AgentClient.submit_input``)."""
    return await client.submit_input(
        session_id,
        request_id,
        path=path,
        approved=answer.approved,
        reason=answer.reason,
        result_json=answer.result_json,
        error=answer.error,
    )


def outcome_text(request_id: str, answer: Answer, reply: pb.SubmitInputResponse) -> str:
    """What the service did with an answer, for people."""
    done = "sent" if reply.applied else "already answered so; nothing changed"
    said = answer_text(answer)
    return f"{request_id}: {said} ({done}; session {status_name(reply.status)})"


class RequestWatch:
    """``call``'s eye on requests for input: folds the root's stream and handles each
    request once, as it appears, by ``mode``: ``ask`` the terminal, ``auto`` approve
    approvals (and explain the rest), or ``hint`` (say how to answer). ``auto_label``
    says why an approval was automatic (``--auto-approve``, ``no terminal``)."""

    def __init__(
        self,
        client: AgentClient,
        session_id: str,
        *,
        mode: str,
        out: TextIO = sys.stdout,
        auto_label: str = AUTO_LABEL,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.mode = mode
        self.out = out
        self.auto_label = auto_label
        self.tree = SessionTree()
        self._handled: set[tuple[str, str]] = set()

    async def add(self, event: pb.StreamEvent) -> None:
        """Fold ``event``; handle every request that is new since the last one."""
        self.tree.add(event)
        for request in self.tree.pending_requests():
            key = (request.session_id, request.request_id)
            if key not in self._handled:
                self._handled.add(key)
                await self._handle(request)

    async def _handle(self, request: PendingRequest) -> None:
        print(request_text(request), file=self.out, flush=True)
        answer: Answer | None = None
        if self.mode == "ask":
            answer = await ask(request, out=self.out)
        elif self.mode == "auto" and request.kind == "approval":
            answer = Answer(approved=True, reason=f"automatic: {self.auto_label}")
            print(f"{self.auto_label}: approving {request.tool_name} by itself", file=self.out)
        if answer is None:
            how = respond_command(self.client.address, self.session_id, request)
            print(f"  {WAITING_TEXT}", file=self.out)
            print(f"  answer it with: {how}", file=self.out, flush=True)
            return
        path = path_from(request.path, self.session_id)
        try:
            reply = await submit(
                self.client, self.session_id, request.request_id, answer, path=path
            )
        except (SessionNotFound, SessionStateConflict, InvalidArgument) as exc:
            # Answered elsewhere meanwhile, or the session ended: the stream says how.
            print(f"helix-mesh: could not answer {request.request_id}: {exc}", file=sys.stderr)
            return
        print(outcome_text(request.request_id, answer, reply), file=self.out)
        route = " > ".join(path) or self.session_id
        print(
            f"  the answer went to {self.client.address}, the service of {self.session_id}, "
            f"and down the path {route}",
            file=self.out,
            flush=True,
        )
