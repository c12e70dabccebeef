"""The client of one A2A child, as the mesh's machinery asks its children things.

The outbox's interrupts (``Cascade``), answers passed down (``SubmitInput``), the waker's
status probes and usage totals all reach a child through ``ClientPool.get(ref.address)``.
An A2A child's ref has the address ``a2a:{agent url}`` (``#task={task id}`` once the
task is known), which the pool hands to ``A2AChildClient``: ``Interrupt`` becomes
``CancelTask``, ``SubmitInput`` the follow-up message on the same task, ``GetStatus``
a ``GetTask``. Everything else a helix service offers has no A2A counterpart here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    Client,
    ClientCallContext,
    ClientConfig,
    create_client,
)
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.errors import A2AError, InvalidParamsError
from google.protobuf.struct_pb2 import Value

from helix_transport._config import ClientConfig as HelixClientConfig
from helix_transport._config import RetryConfig
from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    ConnectError,
    DeadlineExceeded,
    InvalidArgument,
    RemoteError,
    RequestNotFound,
    SessionNotFound,
    SessionStateConflict,
    UsageError,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a._child_projection import (
    ASKING_STATES,
    conversation,
    message_text,
    task_output_json,
    task_usage,
)
from helix_transport.a2a.mapping import TERMINAL_TASK_STATES, session_status
from helix_transport.transport import AgentClient, ClientAuth, ClientPool, register_address_scheme

ADDRESS_PREFIX = "a2a:"
"""Child refs whose address starts so are A2A agents (``a2a:http://host:port``)."""
_TASK_MARK = "#task="

_CARDS: dict[str, AgentCard] = {}
"""Cards given as objects (``a2a_agent_tool(card)``), by url: the pool's clients use
them instead of fetching ``/.well-known/agent-card.json``."""


def a2a_address(url: str, task_id: str = "") -> str:
    """The child-ref address of the agent at ``url`` (and of its task ``task_id``)."""
    return ADDRESS_PREFIX + url + (_TASK_MARK + task_id if task_id else "")


def split_address(address: str) -> tuple[str, str]:
    """``(url, task_id)`` of an ``a2a:`` address (``task_id`` "" when not known yet)."""
    if not address.startswith(ADDRESS_PREFIX):
        raise UsageError(f"{address!r} is not an A2A address (a2a:http://host:port)")
    url, _, task_id = address[len(ADDRESS_PREFIX) :].partition(_TASK_MARK)
    return url, task_id


def remember_card(url: str, card: AgentCard) -> None:
    """Use ``card`` for the agent at ``url`` rather than fetching it."""
    _CARDS[url] = card


@contextlib.contextmanager
def map_a2a_errors(url: str, session_id: str = "") -> Iterator[None]:
    """The one boundary for ``a2a-sdk``'s errors: each becomes the ``HelixError`` a
    helix service would have answered with (``retryable`` when asking again can help)."""
    try:
        yield
    except A2AClientTimeoutError as exc:
        raise DeadlineExceeded(f"A2A agent at {url}: {exc}") from exc
    except A2AClientError as exc:  # the network, an HTTP error status, a broken stream
        raise ConnectError(url, str(exc)) from exc
    except TaskNotFoundError as exc:
        raise SessionNotFound(session_id) from exc
    except TaskNotCancelableError as exc:
        raise SessionStateConflict(session_id, f"its A2A task cannot be canceled: {exc}") from exc
    except InvalidParamsError as exc:
        raise InvalidArgument("message", str(exc)) from exc
    except A2AError as exc:
        raise RemoteError(type(exc).__name__, str(exc)) from exc
    except httpx.HTTPError as exc:  # a card fetch, outside the SDK's own mapping
        raise ConnectError(url, str(exc)) from exc


class A2AChildClient(AgentClient):
    """One A2A agent (and one of its tasks, when the address names it) behind the
    ``AgentClient`` calls the mesh makes of a child.

    Only ``get_status``, ``interrupt`` and ``submit_input`` have a meaning; the tool
    itself (``helix_transport.a2a.child``) talks A2A through ``a2a_client``.
    """

    def __init__(
        self,
        address: str,
        *,
        config: HelixClientConfig = HelixClientConfig.default,
        auth: ClientAuth | None = None,
    ) -> None:
        # No grpc channel: AgentClient's other methods are never reached for this address.
        self.address = address
        self.config = config
        self.url, self.task_id = split_address(address)
        self._auth = auth  # replaced by ClientPool.use_auth when the token rotates
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(config.rpc_timeout.total_seconds(), read=None),
            event_hooks={"request": [self._authorize]},
        )
        self._clients: dict[bool, Client] = {}

    async def _authorize(self, request: httpx.Request) -> None:
        """The parent service's bearer token on every A2A call, as on its helix calls
        (read per call, in the calling task: a forwarded caller's token, a rotated one)."""
        if self._auth is not None:
            for key, value in self._auth.metadata():
                request.headers[key] = value

    async def a2a_client(self, *, streaming: bool = True) -> Client:
        """The ``a2a-sdk`` client for the agent (its card fetched on first use)."""
        client = self._clients.get(streaming)
        if client is None:
            config = ClientConfig(
                streaming=streaming, polling=not streaming, httpx_client=self._http
            )
            with map_a2a_errors(self.url):
                client = await create_client(_CARDS.get(self.url, self.url), client_config=config)
            self._clients[streaming] = client
        return client

    def task_of(self, address: str) -> str:
        """The task id an address of this agent names ("" when none)."""
        return split_address(address)[1]

    def mapped(self, session_id: str) -> contextlib.AbstractContextManager[None]:
        """``map_a2a_errors`` for a call about child ``session_id``."""
        return map_a2a_errors(self.url, session_id)

    async def find_task(self, context_id: str, headers: Mapping[str, str] | None = None) -> str:
        """The id of this client's task: the one its address names, else the one the
        agent holds in ``context_id`` (the child id: a parent that died between its
        message and recording the task's id finds it so); "" when there is none."""
        if self.task_id:
            return self.task_id
        client = await self.a2a_client(streaming=False)
        with map_a2a_errors(self.url, context_id):
            listed = await client.list_tasks(
                ListTasksRequest(context_id=context_id), context=call_context(headers)
            )
        tasks = [t for t in listed.tasks if t.context_id == context_id]
        return tasks[0].id if tasks else ""

    async def get_task(
        self, session_id: str, headers: Mapping[str, str] | None = None, *, task_id: str = ""
    ) -> Task:
        """The child's task (``task_id``, else the one ``find_task`` finds) as the agent
        has it now, its whole history.

        Raises:
            SessionNotFound: the agent holds no task for the child.
        """
        task_id = task_id or await self.find_task(session_id, headers)
        if not task_id:
            raise SessionNotFound(session_id)
        client = await self.a2a_client(streaming=False)
        with map_a2a_errors(self.url, session_id):
            return await client.get_task(GetTaskRequest(id=task_id), context=call_context(headers))

    async def get_status(
        self, session_id: str, *, include_children: bool = False, wait: timedelta | None = None
    ) -> pb.GetStatusResponse:
        """``GetTask``, as ``GetStatus`` would say it (never a long poll)."""
        return status_of(await self.get_task(session_id), session_id)

    async def interrupt(
        self, session_id: str, *, reason: str = "", abort: bool = False
    ) -> pb.InterruptResponse:
        """``CancelTask`` (an abort as well: A2A has one way to stop a task)."""
        task = await self.get_task(session_id)
        if task.status.state in TERMINAL_TASK_STATES:
            return pb.InterruptResponse(status=status_of(task, session_id).status)
        client = await self.a2a_client(streaming=False)
        metadata: dict[str, Any] = {"reason": reason} if reason else {}
        request = CancelTaskRequest(id=task.id)
        request.metadata.update(metadata)
        try:
            with map_a2a_errors(self.url, session_id):
                task = await client.cancel_task(request)
        except SessionStateConflict:  # it ended meanwhile
            task = await self.get_task(session_id)
            return pb.InterruptResponse(status=status_of(task, session_id).status)
        return pb.InterruptResponse(status=status_of(task, session_id).status, accepted=True)

    async def submit_input(
        self,
        session_id: str,
        request_id: str,
        *,
        path: Sequence[str] = (),
        approved: bool | None = None,
        reason: str = "",
        result_json: str | None = None,
        error: str | None = None,
        retry: RetryConfig | None = None,
    ) -> pb.SubmitInputResponse:
        """The answer, as the follow-up message on the child's task (its id derived from
        the request's, so an answer repeated after a lost reply is seen and not sent
        again)."""
        if len(path) > 1:
            raise RequestNotFound(
                session_id, request_id, "an A2A agent has no sub-agents to pass it to"
            )
        task = await self.get_task(session_id)
        message_id = answer_message_id(session_id, request_id)
        if any(m.message_id == message_id for m in conversation(task)):
            return pb.SubmitInputResponse(status=status_of(task, session_id).status, applied=False)
        if task.status.state not in ASKING_STATES:
            raise SessionStateConflict(
                session_id, f"its A2A task does not wait for input {request_id!r}"
            )
        asked = task.status.message.message_id if task.status.HasField("message") else ""
        if request_id not in (asked, f"{task.id}:input:{len(conversation(task))}"):
            raise RequestNotFound(session_id, request_id, "its A2A task asks for another")
        message = answer_message(
            message_id, task, approved=approved, reason=reason, result_json=result_json, error=error
        )
        client = await self.a2a_client(streaming=False)
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        with map_a2a_errors(self.url, session_id):
            async for _ in client.send_message(request):
                break
        return pb.SubmitInputResponse(status=pb.SESSION_STATUS_RUNNING, applied=True)

    async def start(self, input_json: str, **options: Any) -> pb.StartResponse:
        """Refused: an A2A agent is started by ``a2a_agent_tool``, not as a helix one
        (``remote_agent_tool`` given an ``a2a:`` registry entry ends up here)."""
        raise UsageError(
            f"{self.url} is an A2A agent: delegate to it with a2a_agent_tool, not remote_agent_tool"
        )

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
        await self._http.aclose()


def call_context(headers: Mapping[str, str] | None) -> ClientCallContext | None:
    """Extra HTTP headers (gRPC metadata) for one call: the W3C trace context."""
    return ClientCallContext(service_parameters=dict(headers)) if headers else None


def answer_message_id(session_id: str, request_id: str) -> str:
    """The id of the message that answers ``request_id`` of child ``session_id``."""
    return f"{session_id}-answer-{request_id}"


def answer_message(
    message_id: str,
    task: Task,
    *,
    approved: bool | None,
    reason: str,
    result_json: str | None,
    error: str | None,
) -> Message:
    """The follow-up message: a data part the projection reads back
    (``{"approved", "reason"}``, ``{"result"}`` or ``{"error"}``), and a text part for
    agents that read only text."""
    if approved is not None:
        data: dict[str, Any] = {"approved": approved, "reason": reason}
        text = ("approved" if approved else "denied") + (f": {reason}" if reason else "")
    elif error is not None:
        data, text = {"error": error}, f"error: {error}"
    else:
        result = json.loads(result_json or "null")
        data = {"result": result}
        text = result if isinstance(result, str) else json.dumps(result)
    value = Value()
    value.struct_value.update(data)
    return Message(
        message_id=message_id,
        task_id=task.id,
        context_id=task.context_id,
        role=Role.ROLE_USER,
        parts=[Part(text=text), Part(data=value)],
    )


def status_of(task: Task, session_id: str) -> pb.GetStatusResponse:
    """A task as ``GetStatus`` says a session (``mapping``). ``last_sequence`` is 0: an
    A2A task has none (a waker comparing it sees a waiting task as not moved on)."""
    status = session_status(task.status.state) or SessionStatus.RUNNING
    usage = task_usage(task)
    response = pb.GetStatusResponse(
        session_id=session_id, status=status.to_proto(), usage=usage, total_usage=usage
    )
    if status is SessionStatus.COMPLETED:
        response.output_json = task_output_json(task)
    elif status.is_terminal and task.status.HasField("message"):
        response.error = message_text(task.status.message)
    return response


async def _client_for(address: str, pool: ClientPool) -> AgentClient:
    return A2AChildClient(address, config=pool.config, auth=pool.auth)


def register() -> None:
    """Let every ``ClientPool`` reach ``a2a:`` addresses (idempotent)."""
    register_address_scheme(ADDRESS_PREFIX, _client_for)


register()
