"""The helix-mesh error tree.

Every error the library raises on purpose is a ``HelixError``::

    HelixError
    ├── UsageError                 a developer mistake (bad config, bad agent definition)
    ├── InvalidArgument            a request field is malformed   -> INVALID_ARGUMENT
    ├── Unauthenticated            no credential, or a bad one     -> UNAUTHENTICATED
    ├── PermissionDenied           authenticated, not allowed      -> PERMISSION_DENIED
    ├── ResourceExhausted          a limit was hit (rate, capacity, size) -> RESOURCE_EXHAUSTED
    ├── ServerUnavailable          the server is draining or not ready -> UNAVAILABLE
    ├── StoreError                 the state store failed or refused
    │   ├── SessionNotFound        no such session                -> NOT_FOUND
    │   │   └── SessionExpired     it finished and retention removed it
    │   ├── SessionExists          same id, different input       -> ALREADY_EXISTS
    │   ├── SessionStateConflict   not possible in the session's state -> FAILED_PRECONDITION
    │   ├── SequenceConflict       the log moved under a writer (another owner wrote)
    │   ├── LeaseLost              another process owns the session now
    │   └── StoreUnavailable       the backend cannot be reached  -> UNAVAILABLE
    ├── TransportError             talking to a remote agent service failed
    │   ├── ConnectError           could not reach it within the deadline
    │   ├── StreamInterrupted      a stream broke and could not be resumed in time
    │   ├── DeadlineExceeded       a call ran past its deadline
    │   ├── SequenceGap            a stream skipped a sequence (a broken server)
    │   └── RemoteError            the service answered with a non-OK status
    ├── AgentRunError              a run ended without an output
    │   ├── ModelAPIError          the model provider failed
    │   ├── MaxStepsExceeded       the run used all its steps
    │   └── ToolTimeoutError       a tool ran past its timeout
    └── RunInterrupted             the run was interrupted on request

Errors carry the fields that explain them, build their message from those
fields, say whether retrying can help (``retryable``) and pickle cleanly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


class HelixError(Exception):
    """Root of every error helix-mesh raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the constructor's keyword fields so subclasses pickle.
        return (_rebuild, (type(self), self._fields()))

    def _fields(self) -> dict[str, Any]:
        return {"message": self.message}


def _rebuild(cls: type[HelixError], fields: dict[str, Any]) -> HelixError:
    return cls(**fields)


class UsageError(HelixError):
    """The library was used wrongly: fix the code or the configuration."""


class InvalidArgument(HelixError):
    """A request field is malformed. ``field`` names it (``input_json.topic``).

    ``violations`` lists every ``(field, problem)`` found, the first one included;
    on the wire they travel as google.rpc ``BadRequest`` field violations.
    """

    def __init__(
        self, field: str, problem: str, *, violations: Sequence[tuple[str, str]] = ()
    ) -> None:
        more = len(violations) - 1
        super().__init__(f"{field}: {problem}" + (f" (and {more} more)" if more > 0 else ""))
        self.field = field
        self.problem = problem
        self.violations: tuple[tuple[str, str], ...] = tuple(violations) or ((field, problem),)

    def _fields(self) -> dict[str, Any]:
        return {"field": self.field, "problem": self.problem, "violations": self.violations}


class ResourceExhausted(HelixError):
    """A limit was hit: the caller's rate, the replica's capacity, a size.

    ``retry_after_s`` is the server's hint (google.rpc ``RetryInfo``) of when a retry
    can succeed; without one, retrying the same request will not help.
    """

    def __init__(self, limit: str, detail: str, *, retry_after_s: float | None = None) -> None:
        hint = f"; retry after {retry_after_s:.3g}s" if retry_after_s is not None else ""
        super().__init__(f"{detail}{hint}")
        self.limit = limit
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.retryable = retry_after_s is not None

    def _fields(self) -> dict[str, Any]:
        return {"limit": self.limit, "detail": self.detail, "retry_after_s": self.retry_after_s}


class Unauthenticated(HelixError):
    """The caller presented no credential, or one the service does not accept.

    The message says what was wrong (missing, unknown, expired, wrong audience...)
    and never contains the credential itself.
    """


class PermissionDenied(HelixError):
    """The caller is authenticated but may not do this (an admin call by a non-admin)."""


class StoreError(HelixError):
    """The state store failed or refused an operation."""


class SessionNotFound(StoreError):
    """No session with this id exists (or it is not visible to the caller)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class SessionExpired(SessionNotFound):
    """The session finished and was removed after the service's retention time; only its
    tombstone says so, for a while (then it is simply not found)."""

    def __init__(self, session_id: str, expired_at: float | None = None) -> None:
        # A client knows the time only from the server's message (``expired_at`` None).
        when = (
            ""
            if expired_at is None
            else time.strftime(" at %Y-%m-%dT%H:%M:%SZ", time.gmtime(expired_at))
        )
        StoreError.__init__(
            self,
            f"session {session_id!r} expired: it finished and was removed{when} "
            "(finished sessions are kept for the service's retention time)",
        )
        self.session_id = session_id
        self.expired_at = expired_at

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "expired_at": self.expired_at}


class RequestNotFound(SessionNotFound):
    """The session (or the tree below it) has no request for input with this id, or
    the ``path`` given with it leaves the caller's tree."""

    def __init__(self, session_id: str, request_id: str, detail: str = "") -> None:
        StoreError.__init__(
            self,
            f"session {session_id!r}: no request for input {request_id!r}"
            + (f" ({detail})" if detail else ""),
        )
        self.session_id = session_id
        self.request_id = request_id

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "request_id": self.request_id}


class SessionExists(StoreError):
    """A session with this id exists with a different input."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists with a different input")
        self.session_id = session_id

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class SessionStateConflict(StoreError):
    """The request is not possible in the session's current state (``Continue`` on a
    running session, or naming a turn that is not the next one)."""

    def __init__(self, session_id: str, problem: str) -> None:
        super().__init__(f"session {session_id!r}: {problem}")
        self.session_id = session_id
        self.problem = problem

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "problem": self.problem}


class SequenceConflict(StoreError):
    """An append expected the log to end at ``expected`` but it ends at ``actual``.

    Raised when another writer appended to the session: the caller no longer owns it.
    """

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r}: expected the log to end at sequence {expected}, "
            f"but it ends at {actual}"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "expected": self.expected, "actual": self.actual}


class LeaseLost(StoreError):
    """Another process took over the session; this one must stop writing to it."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id!r}: lease no longer held by {owner!r}")
        self.session_id = session_id
        self.owner = owner

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "owner": self.owner}


class StoreUnavailable(StoreError):
    """The store backend cannot be reached; retrying later may help."""

    retryable = True


class ServerUnavailable(HelixError):
    """The server is draining or not ready; retry elsewhere."""

    retryable = True


class TransportError(HelixError):
    """Talking to a remote agent service failed."""


class ConnectError(TransportError):
    """The remote service could not be reached within the deadline."""

    retryable = True

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"cannot reach agent service at {address}: {detail}")
        self.address = address
        self.detail = detail

    def _fields(self) -> dict[str, Any]:
        return {"address": self.address, "detail": self.detail}


class StreamInterrupted(TransportError):
    """A stream broke and could not be resumed before its reconnect deadline."""

    retryable = True

    def __init__(self, session_id: str, last_sequence: int, detail: str) -> None:
        super().__init__(
            f"stream of session {session_id!r} broke after sequence {last_sequence} "
            f"and could not be resumed: {detail}"
        )
        self.session_id = session_id
        self.last_sequence = last_sequence
        self.detail = detail

    def _fields(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "last_sequence": self.last_sequence,
            "detail": self.detail,
        }


class DeadlineExceeded(TransportError):
    """A call ran past its deadline."""

    retryable = True


class SequenceGap(TransportError):
    """A stream delivered ``got`` when ``expected`` was next: the server broke the contract."""

    def __init__(self, session_id: str, expected: int, got: int) -> None:
        super().__init__(
            f"stream of session {session_id!r} skipped from sequence {expected - 1} to {got}"
        )
        self.session_id = session_id
        self.expected = expected
        self.got = got

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "expected": self.expected, "got": self.got}


class RemoteError(TransportError):
    """The remote service answered with a non-OK gRPC status (``code`` is its name)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail

    def _fields(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail}


class AgentRunError(HelixError):
    """A run ended without an output. ``failure_reason`` is machine-readable."""

    failure_reason: str = "internal"


class ModelAPIError(AgentRunError):
    """The model provider failed."""

    failure_reason = "model_error"
    retryable = True

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed: {detail}")
        self.model = model
        self.detail = detail

    def _fields(self) -> dict[str, Any]:
        return {"model": self.model, "detail": self.detail}


class MaxStepsExceeded(AgentRunError):
    """The run used all of its steps without producing an output."""

    failure_reason = "max_steps"

    def __init__(self, max_steps: int) -> None:
        super().__init__(f"no output after {max_steps} steps (max_steps)")
        self.max_steps = max_steps

    def _fields(self) -> dict[str, Any]:
        return {"max_steps": self.max_steps}


class ToolTimeoutError(AgentRunError):
    """A tool call ran past its timeout."""

    failure_reason = "tool_timeout"

    def __init__(self, tool_name: str, timeout_s: float) -> None:
        super().__init__(f"tool {tool_name!r} timed out after {timeout_s:g}s")
        self.tool_name = tool_name
        self.timeout_s = timeout_s

    def _fields(self) -> dict[str, Any]:
        return {"tool_name": self.tool_name, "timeout_s": self.timeout_s}


class RunInterrupted(HelixError):
    """The run was interrupted on request (a first-party cancel, not a failure)."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id!r} interrupted: {reason or 'no reason given'}")
        self.session_id = session_id
        self.reason = reason

    def _fields(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "reason": self.reason}
