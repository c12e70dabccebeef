"""The page's HTTP side: static assets, a JSON API and server-sent event streams (one
per open session, one of the session list), bridging the page to the agent services
over gRPC.

Every gRPC call goes out with the CLI's credentials, so the page guards them, in one
place for every call that changes something (``_guarded``: an interrupt, an answer):
it answers only requests addressed to 127.0.0.1 or localhost (another host name would
be DNS rebinding), such a call must carry the ``X-Helix-Inspect`` header (which a
cross-site form cannot send, nor a cross-site script without a preflight this server
never approves), and every call, reading ones too, goes only to a service the page
knows: the inspected one, a child service a session tree named, or one the mesh
registry names for an agent type (``helix_transport.registry``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from helix_transport._events import EVENT_KINDS, SessionStatus, Tone
from helix_transport._exceptions import HelixError, UsageError
from helix_transport.agent.inputs import Answer
from helix_transport.cli.answer import answer_text, path_from, submit
from helix_transport.cli.exits import ExitCode, for_error
from helix_transport.cli.inspector.feed import Message, TreeFeed
from helix_transport.cli.inspector.sessions import list_sessions, watch_sessions
from helix_transport.cli.jsonout import message_json
from helix_transport.registry import resolve_address
from helix_transport.transport import ClientPool

GUARD_HEADER = "X-Helix-Inspect"
"""The header the page's own script sends with a request that changes something."""
SESSIONS_LIMIT = 200
"""The most sessions the list asks for at once."""

_STATIC = Path(str(files("helix_transport.cli.inspector") / "static"))
_HTTP_STATUS = {ExitCode.USAGE: 400, ExitCode.UNREACHABLE: 502}


class _Refused(Exception):
    """A request the guard or the parsing refuses, as the page is told."""

    def __init__(self, status_code: int, error: str) -> None:
        super().__init__(error)
        self.response = JSONResponse({"error": error}, status_code=status_code)


class Inspector:
    """What the page's handlers share: the inspected address, one client per service."""

    def __init__(self, address: str, pool: ClientPool) -> None:
        self.address = address
        self.pool = pool
        self.known_addresses = {address}
        """Where a call may go: the service, child services trees named, and services
        the registry named when the page asked for an agent type's."""

    def app(self) -> Starlette:
        """The ASGI application."""
        return Starlette(
            routes=[
                Route("/", self.index),
                Route("/api/info", self.info),
                Route("/api/event-kinds", self.event_kinds),
                Route("/api/services", self.services),
                Route("/api/resolve", self.resolve),
                Route("/api/sessions", self.sessions),
                Route("/api/sessions/watch", self.watch),
                Route("/api/sessions/{session_id}/stream", self.stream),
                Route("/api/interrupt", self.interrupt, methods=["POST"]),
                Route("/api/answer", self.answer, methods=["POST"]),
                Mount("/static", StaticFiles(directory=_STATIC), name="static"),
            ],
            middleware=[
                Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost"])
            ],
        )

    async def index(self, request: Request) -> Response:
        return FileResponse(_STATIC / "index.html", headers=_NO_STORE)

    async def info(self, request: Request) -> Response:
        """A service (``?address=``, the inspected one by default): its address, and
        what ``Describe`` says."""
        try:
            address = self._known(request.query_params.get("address"))
            client = await self.pool.get(address)
            described = message_json(await client.describe())
        except _Refused as refused:
            return refused.response
        except HelixError as exc:
            return _error(exc)
        return JSONResponse({"address": address, "agent": described})

    async def event_kinds(self, request: Request) -> Response:
        """The table of event kinds (``EVENT_KINDS``: name, terminal, status implied),
        the session statuses and the summaries' tones: what the page knows of kinds."""
        return JSONResponse(event_kinds_json())

    async def services(self, request: Request) -> Response:
        """The services this page may call: the inspected one first."""
        others = sorted(self.known_addresses - {self.address})
        return JSONResponse({"inspected": self.address, "addresses": [self.address, *others]})

    async def resolve(self, request: Request) -> Response:
        """Where the registry says ``?agent_type=`` is served; the page may call it then."""
        agent_type = request.query_params.get("agent_type", "")
        if not agent_type:
            return JSONResponse({"error": "give ?agent_type="}, status_code=400)
        try:
            # The registry may read a file: off the event loop.
            address = await asyncio.to_thread(resolve_address, agent_type)
        except UsageError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        self.known_addresses.add(address)
        return JSONResponse({"agent_type": agent_type, "address": address})

    async def sessions(self, request: Request) -> Response:
        """Recent sessions, newest first: ``?roots_only=1&status=running&limit=50``
        (and ``&address=`` for another service than the inspected one)."""
        try:
            address, filters = self._list_query(request)
            client = await self.pool.get(address)
            found = await list_sessions(client, **filters)
        except _Refused as refused:
            return refused.response
        except HelixError as exc:
            return _error(exc)
        return JSONResponse({"sessions": found}, headers=_NO_STORE)

    async def watch(self, request: Request) -> Response:
        """The recent sessions as server-sent events, sent again whenever they change
        (``sessions.py``); the same query as ``/api/sessions``."""
        try:
            address, filters = self._list_query(request)
        except _Refused as refused:
            return refused.response
        client = await self.pool.get(address)
        return _event_stream(watch_sessions(client, **filters))

    async def stream(self, request: Request) -> Response:
        """The session's live tree, as server-sent events (see ``feed.py``); the
        session is on ``?address=`` (the inspected service by default)."""
        try:
            address = self._known(request.query_params.get("address"))
        except _Refused as refused:
            return refused.response
        client = await self.pool.get(address)
        feed = TreeFeed(
            client,
            request.path_params["session_id"],
            on_address=self.known_addresses.add,
            client_for=self.pool.get,
        )
        return _event_stream(feed.messages())

    async def interrupt(self, request: Request) -> Response:
        """Interrupt one node: ``{"session_id": ..., "address": ..., "reason": ...}``."""
        try:
            body, address = await self._guarded(request)
            client = await self.pool.get(address)
            result = await client.interrupt(body["session_id"], reason=str(body.get("reason", "")))
        except _Refused as refused:
            return refused.response
        except HelixError as exc:
            return _error(exc)
        return JSONResponse(message_json(result))

    async def answer(self, request: Request) -> Response:
        """Answer a request for input waiting in the tree of ``session_id`` (on
        ``address``), as ``helix-mesh respond`` does: ``{"session_id", "address",
        "request_id", "path"}`` (the request's path from the root, as the tree gives
        it) and one of ``"approved": true|false`` (with ``"reason"``), ``"result_json"``
        (a client tool's result, JSON text) or ``"error"`` (the client tool failed)."""
        try:
            body, address = await self._guarded(request)
            request_id, path, answer = _answer(body)
            session_id = body["session_id"]
            client = await self.pool.get(address)
            reply = await submit(
                client, session_id, request_id, answer, path=path_from(path, session_id)
            )
        except _Refused as refused:
            return refused.response
        except HelixError as exc:
            return _error(exc)
        return JSONResponse({**message_json(reply), "answer": answer_text(answer)})

    async def _guarded(self, request: Request) -> tuple[dict[str, Any], str]:
        """The one guard of a call that changes something: the page's header, a JSON
        object naming the session, and a service this page knows. Returns the body
        (``session_id`` a string) and the service's address.

        Raises:
            _Refused: 403 without the header or toward another service, 400 for a body
                that is not such an object.
        """
        if request.headers.get(GUARD_HEADER) != "1":
            raise _Refused(403, f"missing header {GUARD_HEADER}")
        try:
            body = json.loads(await request.body())
            body["session_id"] = str(body["session_id"])
        except (ValueError, KeyError, TypeError):
            raise _Refused(400, "body: give JSON with session_id") from None
        return body, self._known(body.get("address"))

    def _known(self, address: object) -> str:
        """``address`` (the inspected service when empty), if the page may call it.

        Raises:
            _Refused: 403 for another service.
        """
        address = str(address or self.address)
        if address not in self.known_addresses:
            raise _Refused(403, f"address {address!r} is not one this page inspects")
        return address

    def _list_query(self, request: Request) -> tuple[str, dict[str, Any]]:
        query = request.query_params
        try:
            limit = min(int(query.get("limit", "50")), SESSIONS_LIMIT)
            statuses = [SessionStatus(s) for s in query.getlist("status")]
        except ValueError as exc:
            raise _Refused(400, f"bad query: {exc}") from None
        address = self._known(query.get("address"))
        roots_only = query.get("roots_only") == "1"
        return address, {"statuses": statuses, "roots_only": roots_only, "limit": limit}


def _answer(body: dict[str, Any]) -> tuple[str, tuple[str, ...], Answer]:
    """The request id, its path and the answer an ``/api/answer`` body gives.

    Raises:
        _Refused: 400, with what is wrong.
    """
    request_id = body.get("request_id")
    path = body.get("path", [])
    if not isinstance(request_id, str) or not request_id:
        raise _Refused(400, "body: give request_id")
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        raise _Refused(400, "body: path is a list of session ids")
    given = [key for key in ("approved", "result_json", "error") if body.get(key) is not None]
    if len(given) != 1:
        raise _Refused(400, "body: give one answer: approved, result_json or error")
    if given == ["approved"]:
        if not isinstance(body["approved"], bool):
            raise _Refused(400, "body: approved is true or false")
        answer = Answer(approved=body["approved"], reason=str(body.get("reason") or ""))
    elif given == ["error"]:
        answer = Answer(error=str(body["error"]) or "failed")
    else:
        try:
            json.loads(str(body["result_json"]))
        except ValueError as exc:
            raise _Refused(400, f"result_json is not JSON: {exc}") from None
        answer = Answer(result_json=str(body["result_json"]))
    return request_id, tuple(path), answer


_NO_STORE = {"Cache-Control": "no-store"}


def event_kinds_json() -> dict[str, list[Any]]:
    """``EVENT_KINDS`` for the page, with the statuses and tones it styles."""
    return {
        "kinds": [
            {
                "name": kind.name,
                "terminal": kind.terminal,
                "status": kind.status.value if kind.status is not None else None,
            }
            for kind in EVENT_KINDS.values()
        ],
        "statuses": [status.value for status in SessionStatus],
        "tones": [tone.value for tone in Tone if tone is not Tone.PLAIN],
    }


def _error(exc: HelixError) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=_HTTP_STATUS.get(for_error(exc), 500))


def _event_stream(messages: AsyncIterator[Message]) -> StreamingResponse:
    return StreamingResponse(
        _server_sent(messages),
        media_type="text/event-stream",
        headers={**_NO_STORE, "X-Accel-Buffering": "no"},
    )


async def _server_sent(messages: AsyncIterator[Message]) -> AsyncIterator[str]:
    """``text/event-stream`` framing of the messages. ``retry`` tells the browser how
    soon to reconnect if this response breaks (the page stops a session's once ended)."""
    yield "retry: 1000\n\n"
    async for message in messages:
        data = json.dumps(message.data, ensure_ascii=False, separators=(",", ":"))
        yield f"event: {message.name}\ndata: {data}\n\n"
