"""The ``a2a`` section's plumbing: the official ``a2a-sdk`` client against one A2A
endpoint, each stream read to its end (or a deadline), and one check's verdict.

It speaks only what an A2A client sees (the card, JSON-RPC over HTTP and SSE), through
the SDK's own client, so a helix endpoint is judged as any A2A peer would meet it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from helix_transport._optional import requires

with requires("a2a", "the conformance kit's a2a section"):
    from a2a.client import ClientCallContext, ClientConfig, create_client
    from a2a.client.client import Client
    from a2a.types import a2a_pb2 as a2a
    from a2a.utils.errors import A2AError

from google.protobuf import json_format

from helix_transport.testing.conformance._contract import Failed, Skipped, require
from helix_transport.testing.conformance.report import CheckResult

METADATA_KEY = "helix"
"""Where a helix endpoint puts its own fields in A2A ``metadata``."""
FROM_SEQUENCE_HEADER = "helix-from-sequence"
TERMINAL_STATES = frozenset(
    {
        a2a.TASK_STATE_COMPLETED,
        a2a.TASK_STATE_FAILED,
        a2a.TASK_STATE_CANCELED,
        a2a.TASK_STATE_REJECTED,
    }
)
"""The states after which a task changes no more (and a stream ends)."""


def state_name(state: int) -> str:
    return a2a.TaskState.Name(state).removeprefix("TASK_STATE_").lower()


def metadata(update: Any) -> dict[str, Any]:
    """The ``helix`` metadata of a stream event or task (empty when it has none)."""
    value = json_format.MessageToDict(update.metadata).get(METADATA_KEY)
    return value if isinstance(value, dict) else {}


def data_of(part: a2a.Part) -> Any:
    return json_format.MessageToDict(part.data) if part.HasField("data") else None


@dataclass
class Streamed:
    """What one A2A stream (``SendStreamingMessage`` or ``SubscribeToTask``) delivered."""

    task: a2a.Task | None = None
    """The snapshot the stream began with."""
    updates: list[a2a.StreamResponse] = field(default_factory=list)
    """The status and artifact updates after it, in order."""
    end: str = "ok"
    """``ok`` (the server ended it), ``timeout`` (still open) or ``left`` (we left)."""

    @property
    def sequences(self) -> list[int | None]:
        """Every sequence the updates cover, in order (an update of joined text deltas
        covers ``first_sequence`` .. ``sequence``); None for one that carries none."""
        found: list[int | None] = []
        for update in self.updates:
            last = sequence_of(update)
            first = first_sequence_of(update)
            found += [None] if last is None else range(first or last, last + 1)
        return found

    @property
    def last_state(self) -> int | None:
        states = [u.status_update.status.state for u in self.updates if u.HasField("status_update")]
        return states[-1] if states else None

    def require_gapless(self, what: str, *, first: int) -> None:
        """Every update carries ``metadata.helix.sequence``: ``first, first + 1, ...``."""
        require(self.task is not None, f"{what}: the stream did not begin with the Task")
        require(bool(self.updates), f"{what}: no status or artifact update after the Task")
        sequences = self.sequences
        missing = [n for n, u in enumerate(self.updates) if sequence_of(u) is None]
        require(
            not missing,
            f"{what}: update #{missing[0] + 1 if missing else 0} carries no "
            f"metadata.{METADATA_KEY}.sequence (a helix endpoint puts it on every event)",
        )
        wanted = list(range(first, first + len(sequences)))
        require(
            sequences == wanted,
            f"{what}: sequences {sequences[:40]} are not {first}, {first + 1}, ... with no gap",
        )

    def require_ended(self, what: str) -> None:
        require(self.end == "ok", f"{what}: the stream was still open after its last update")


def sequence_of(update: a2a.StreamResponse) -> int | None:
    if update.HasField("status_update"):
        found = metadata(update.status_update).get("sequence")
    elif update.HasField("artifact_update"):
        found = metadata(update.artifact_update).get("sequence")
    else:
        return None
    return int(found) if isinstance(found, int | float) else None


def first_sequence_of(update: a2a.StreamResponse) -> int | None:
    """``metadata.helix.first_sequence``: the first of several text deltas an update
    joins (None for an update of one event)."""
    found = metadata(update.artifact_update).get("first_sequence")
    return int(found) if isinstance(found, int | float) else None


def is_text(update: a2a.StreamResponse) -> bool:
    """Whether ``update`` is a chunk of the ``text`` artifact (the root's text deltas)."""
    return update.HasField("artifact_update") and (
        update.artifact_update.artifact.artifact_id == "text"
    )


def message_id_of(update: a2a.StreamResponse) -> str:
    if update.HasField("status_update"):
        return update.status_update.status.message.message_id
    return ""


class A2AKit:
    """One run of the ``a2a`` section against one endpoint: its client and verdicts."""

    def __init__(
        self,
        url: str,
        *,
        input_json: str,
        bad_input_json: str | None,
        input_required_json: str | None,
        timeout_s: float,
        token: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self.input_json = input_json
        self.bad_input_json = bad_input_json
        self.input_required_json = input_required_json
        self.deadline = time.monotonic() + timeout_s
        self.rpc_timeout_s = min(10.0, timeout_s)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=self.rpc_timeout_s)
        self.results: list[CheckResult] = []
        self.card: a2a.AgentCard | None = None
        self.skill_tags: frozenset[str] = frozenset()
        self.input_schema: Any = None
        self.main: Streamed | None = None
        """The first task's stream (``a2a.stream``), for the checks that read it again."""
        self._clients: dict[bool, Client] = {}

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.close()
        await self.http.aclose()

    async def client(self, *, streaming: bool = True) -> Client:
        """The SDK's client of the endpoint, made from its card (one per mode)."""
        if streaming not in self._clients:
            config = ClientConfig(streaming=streaming, httpx_client=self.http)
            self._clients[streaming] = await create_client(self.url, client_config=config)
        return self._clients[streaming]

    def message(self, data: Any = None, *, text: str = "", task_id: str = "") -> a2a.Message:
        """A new user message (a fresh ``messageId``) with a data part and/or text."""
        message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, task_id=task_id)
        if data is not None:
            json_format.ParseDict(data, message.parts.add().data)
        if text:
            message.parts.add(text=text)
        return message

    def input_message(self, input_json: str | None = None) -> a2a.Message:
        return self.message(json.loads(input_json or self.input_json))

    async def stream(
        self,
        events: AsyncIterator[a2a.StreamResponse],
        *,
        leave_after: int | None = None,
    ) -> Streamed:
        """Read ``events`` to their end (or the kit's deadline, or ``leave_after`` updates)."""
        result = Streamed()
        try:
            while True:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    result.end = "timeout"
                    return result
                try:
                    event = await asyncio.wait_for(anext(events), remaining)
                except StopAsyncIteration:
                    return result
                except TimeoutError:
                    result.end = "timeout"
                    return result
                if event.HasField("task") and result.task is None and not result.updates:
                    result.task = event.task
                else:
                    result.updates.append(event)
                if leave_after is not None and len(result.updates) >= leave_after:
                    result.end = "left"
                    return result
        finally:
            closing = getattr(events, "aclose", None)
            if closing is not None:
                await closing()

    async def send_stream(self, message: a2a.Message) -> Streamed:
        client = await self.client()
        return await self.stream(client.send_message(a2a.SendMessageRequest(message=message)))

    async def subscribe(self, task_id: str, *, from_sequence: int | None = None) -> Streamed:
        client = await self.client()
        context = None
        if from_sequence is not None:
            context = ClientCallContext(
                service_parameters={FROM_SEQUENCE_HEADER: str(from_sequence)}
            )
        return await self.stream(
            client.subscribe(a2a.SubscribeToTaskRequest(id=task_id), context=context)
        )

    async def expect_error(self, error: type[A2AError], call: Awaitable[object]) -> str:
        """Await ``call``; it must fail with ``error``; its message."""
        try:
            await call
        except A2AError as exc:
            require(
                isinstance(exc, error),
                f"expected {error.__name__}, got {type(exc).__name__}: {exc.message}",
            )
            return exc.message
        raise Failed(f"expected {error.__name__}, but the call succeeded")

    async def check(self, name: str, body: Callable[[], Awaitable[str]]) -> bool:
        """Run one check; record its verdict. True when it passed (or was skipped)."""
        try:
            detail = await body()
        except Failed as exc:
            self.results.append(CheckResult(name, False, str(exc)))
            return False
        except Skipped as exc:
            self.results.append(CheckResult(name, True, str(exc), skipped=True))
            return True
        except A2AError as exc:
            self.results.append(CheckResult(name, False, f"unexpected {type(exc).__name__}: {exc}"))
            return False
        except TimeoutError:
            self.results.append(CheckResult(name, False, "timed out"))
            return False
        except Exception as exc:  # an answer the kit did not foresee is a failure, not a crash
            self.results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))
            return False
        self.results.append(CheckResult(name, True, detail))
        return True

    def not_run(self, names: tuple[str, ...], why: str) -> None:
        for name in names:
            self.results.append(CheckResult(name, False, f"not run: {why}"))
