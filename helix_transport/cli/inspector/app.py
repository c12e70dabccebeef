"""The page's HTTP side: static assets, a JSON API and one server-sent event stream
per open session, bridging the page to the agent services over gRPC.

Every gRPC call goes out with the CLI's credentials, so the page guards them: it
answers only requests addressed to 127.0.0.1 or localhost (another host name would
be DNS rebinding), the one call that changes anything (interrupt) must carry the
``X-Helix-Inspect`` header (which a cross-site form cannot send, nor a cross-site
script without a preflight this server never approves), and it goes only to the
inspected service or to a child service address a session tree named.
"""

from __future__ import annotations

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
from helix_transport._exceptions import HelixError
from helix_transport.cli.exits import ExitCode, for_error
from helix_transport.cli.inspector.feed import TreeFeed
from helix_transport.cli.jsonout import message_json
from helix_transport.transport import ClientPool

GUARD_HEADER = "X-Helix-Inspect"
"""The header the page's own script sends with a request that changes something."""
SESSIONS_LIMIT = 200
"""The most sessions the list asks for at once."""

_STATIC = Path(str(files("helix_transport.cli.inspector") / "static"))
_HTTP_STATUS = {ExitCode.USAGE: 400, ExitCode.UNREACHABLE: 502}


class Inspector:
    """What the page's handlers share: the inspected address, one client per service."""

    def __init__(self, address: str, pool: ClientPool) -> None:
        self.address = address
        self.pool = pool
        self.known_addresses = {address}
        """Where an interrupt may go: the service, and child services trees named."""

    def app(self) -> Starlette:
        """The ASGI application."""
        return Starlette(
            routes=[
                Route("/", self.index),
                Route("/api/info", self.info),
                Route("/api/event-kinds", self.event_kinds),
                Route("/api/sessions", self.sessions),
                Route("/api/sessions/{session_id}/stream", self.stream),
                Route("/api/interrupt", self.interrupt, methods=["POST"]),
                Mount("/static", StaticFiles(directory=_STATIC), name="static"),
            ],
            middleware=[
                Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost"])
            ],
        )

    async def index(self, request: Request) -> Response:
        return FileResponse(_STATIC / "index.html", headers=_NO_STORE)

    async def info(self, request: Request) -> Response:
        """The inspected service: its address, and what ``Describe`` says."""
        try:
            client = await self.pool.get(self.address)
            described = message_json(await client.describe())
        except HelixError as exc:
            return _error(exc)
        return JSONResponse({"address": self.address, "agent": described})

    async def event_kinds(self, request: Request) -> Response:
        """The table of event kinds (``EVENT_KINDS``: name, terminal, status implied),
        the session statuses and the summaries' tones: what the page knows of kinds."""
        return JSONResponse(event_kinds_json())

    async def sessions(self, request: Request) -> Response:
        """Recent sessions, newest first: ``?roots_only=1&status=running&limit=50``."""
        query = request.query_params
        try:
            limit = min(int(query.get("limit", "50")), SESSIONS_LIMIT)
            statuses = [SessionStatus(s) for s in query.getlist("status")]
        except ValueError as exc:
            return JSONResponse({"error": f"bad query: {exc}"}, status_code=400)
        try:
            client = await self.pool.get(self.address)
            found = [
                message_json(summary)
                async for summary in client.iter_sessions(
                    statuses=statuses, roots_only=query.get("roots_only") == "1", limit=limit
                )
            ]
        except HelixError as exc:
            return _error(exc)
        return JSONResponse({"sessions": found}, headers=_NO_STORE)

    async def stream(self, request: Request) -> Response:
        """The session's live tree, as server-sent events (see ``feed.py``)."""
        client = await self.pool.get(self.address)
        feed = TreeFeed(client, request.path_params["session_id"], on_address=self._learn)
        return StreamingResponse(
            _server_sent(feed),
            media_type="text/event-stream",
            headers={**_NO_STORE, "X-Accel-Buffering": "no"},
        )

    async def interrupt(self, request: Request) -> Response:
        """Interrupt one node: ``{"session_id": ..., "address": ..., "reason": ...}``."""
        if request.headers.get(GUARD_HEADER) != "1":
            return JSONResponse({"error": f"missing header {GUARD_HEADER}"}, status_code=403)
        try:
            body = json.loads(await request.body())
            session_id = str(body["session_id"])
            address = str(body.get("address") or self.address)
            reason = str(body.get("reason", ""))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "body: give JSON with session_id"}, status_code=400)
        if address not in self.known_addresses:
            return JSONResponse(
                {"error": f"address {address!r} is not one this page inspects"}, status_code=403
            )
        try:
            client = await self.pool.get(address)
            result = await client.interrupt(session_id, reason=reason)
        except HelixError as exc:
            return _error(exc)
        return JSONResponse(message_json(result))

    def _learn(self, address: str) -> None:
        self.known_addresses.add(address)


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


async def _server_sent(feed: TreeFeed) -> AsyncIterator[str]:
    """``text/event-stream`` framing of the feed's messages. ``retry`` tells the browser
    how soon to reconnect if this response breaks (the page stops it once ended)."""
    yield "retry: 1000\n\n"
    async for message in feed.messages():
        data = json.dumps(message.data, ensure_ascii=False, separators=(",", ":"))
        yield f"event: {message.name}\ndata: {data}\n\n"
