"""``SubmitInput``: an answer to a request for input, routed down to the session that
asked, recorded once, and the sessions on its way woken.

The caller holds the root (or any session on the request's path). Each service on the
path checks that the next session is a child of its own (its ref), passes the request
on to that child's service with its own credentials, and once the child has taken it,
wakes its own session if it is suspended: the child runs first, then each parent
rejoins it. The session that asked records the answer in its store (insert-if-absent,
so a retry is a no-op and a different answer is refused) before it replies, then wakes.
A reply therefore means the answer is durable where it applies; an error (a service on
the way down, say) means the caller retries, safely.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    HelixError,
    InvalidArgument,
    RequestNotFound,
    ServerUnavailable,
    SessionNotFound,
    SessionStateConflict,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.inputs import Answer, InputState
from helix_transport.agent.state import split_state
from helix_transport.server._sessions import Sessions
from helix_transport.store import SessionRecord

logger = logging.getLogger("helix.server")

PASS_DOWN_RETRY = timedelta(seconds=5)
"""How long a service retries passing an answer to a child's service that is
unreachable before it answers UNAVAILABLE (the caller retries the whole call)."""


class InputRouter:
    """Answers requests for input of one service's sessions and the trees below them."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.store = sessions.store

    async def submit(
        self, key: str, session_id: str, request: pb.SubmitInputRequest
    ) -> pb.SubmitInputResponse:
        """Route ``request`` (for the caller's session ``session_id``, stored under
        ``key``) to the session that asked; the status of ``session_id`` after it."""
        answer = Answer.from_request(request)  # INVALID_ARGUMENT before any lookup
        path = list(request.path)
        if path and path[0] != session_id:
            raise InvalidArgument("path", "must start with session_id")
        record = await self.sessions.get(key, session_id)
        if len(path) > 1:
            applied = await self._pass_down(record, session_id, path, request)
        else:
            applied = await self._record(record, session_id, request.request_id, answer)
        status = await self._wake(record.session_id)
        return pb.SubmitInputResponse(status=status.to_proto(), applied=applied)

    async def _pass_down(
        self,
        record: SessionRecord,
        session_id: str,
        path: list[str],
        request: pb.SubmitInputRequest,
    ) -> bool:
        child_id, request_id = path[1], request.request_id
        ref = await self.store.get_subsession_ref(record.session_id, child_id)
        if ref is None or not ref.address:
            raise RequestNotFound(session_id, request_id, f"no sub-agent {child_id!r}")
        which = request.WhichOneof("answer")
        result = request.result if which == "result" else None
        try:
            client = await self.sessions.clients.get(ref.address)
            response = await client.submit_input(
                child_id,
                request_id,
                path=path[1:],
                approved=request.approval.approved if which == "approval" else None,
                reason=request.approval.reason,
                result_json=result.result_json if result else None,
                error=(result.error or None) if result else None,
                # Briefly: the caller is waiting, and retries the whole path itself.
                retry=replace(client.config.reconnect, deadline=PASS_DOWN_RETRY),
            )
        except SessionNotFound:  # RequestNotFound too: the child's tree has no such request
            raise RequestNotFound(session_id, request_id, f"not below {child_id!r}") from None
        except SessionStateConflict as exc:
            raise SessionStateConflict(session_id, exc.problem) from None
        except InvalidArgument:
            raise
        except HelixError as exc:
            # The child's service is out of reach (the answer may have landed, its reply
            # not): the caller retries, and an answer recorded already is then a no-op.
            logger.warning(
                "session %s: input %s not passed to %s at %s: %s",
                session_id,
                request_id,
                child_id,
                ref.address,
                exc.message,
            )
            raise ServerUnavailable(
                f"the service of sub-agent {child_id!r} did not take the answer; retry"
            ) from exc
        return response.applied

    async def _record(
        self, record: SessionRecord, session_id: str, request_id: str, answer: Answer
    ) -> bool:
        """Store ``answer`` for the session's own request ``request_id``."""
        if not request_id:
            raise InvalidArgument("request_id", "must not be empty")
        key = record.session_id
        checkpoint = await self.store.load_checkpoint(key)
        pending = InputState.of(split_state(checkpoint.state)[1]).pending if checkpoint else {}
        answers = await self.store.list_answers(key)
        asked = pending.get(request_id)
        if asked is None and request_id not in answers:
            raise RequestNotFound(session_id, request_id)
        if asked is not None and asked.kind != answer.kind:
            field = "approval" if answer.kind == "approval" else "result"
            raise InvalidArgument(field, f"request {request_id!r} asks for a {asked.kind}")
        if record.status.is_terminal and request_id not in answers:
            raise SessionStateConflict(
                session_id, f"it is {record.status.value}: request {request_id!r} is cancelled"
            )
        stored, applied = await self.store.put_answer(key, request_id, answer.to_json())
        if not applied and Answer.from_json(stored) != answer:
            raise SessionStateConflict(
                session_id, f"request {request_id!r} was answered already, differently"
            )
        return applied

    async def _wake(self, key: str) -> SessionStatus:
        """Run the session again if it is suspended; its status now."""
        record = await self.store.get_session(key)
        if record is None:
            return SessionStatus.RUNNING
        woken = record.status is SessionStatus.SUSPENDED and await self.sessions.runner.wake(
            record, reason="input"
        )
        return SessionStatus.RUNNING if woken else record.status
