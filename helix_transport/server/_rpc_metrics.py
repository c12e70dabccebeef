"""RPC metrics: every call's duration and status, refusals by reason, live streams.

Installed first (outermost, before authentication) when metrics are on, so it sees
every answer, the refusals of the interceptors inside it included. The reason of a
refusal comes from the status the call ended with, and for ``RESOURCE_EXHAUSTED``
from the ``ErrorInfo`` reason the limits put in its details (``rate_limit``,
``running_sessions``): one place decides, however deep the refusal was raised.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc

from helix_transport._rich_status import read_details
from helix_transport.metrics.instruments import instruments
from helix_transport.server._handlers import wrap_handler
from helix_transport.server.auth import HEALTH_PREFIX

__all__ = ["RpcMetricsInterceptor", "refusal_reason"]

_Context = grpc.aio.ServicerContext[Any, Any]

_LIMIT_REASONS = {"rate_limit": "rate_limit", "running_sessions": "capacity"}
"""``ErrorInfo`` reasons of ``RESOURCE_EXHAUSTED`` -> ``helix.refusal.reason``."""


def refusal_reason(code: grpc.StatusCode, limit: str = "") -> str | None:
    """The ``helix.refusal.reason`` of a call that ended with ``code`` (None: not a
    refusal); ``limit`` is a ``RESOURCE_EXHAUSTED``'s ``ErrorInfo`` reason."""
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return "auth"
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return "bad_input"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return _LIMIT_REASONS.get(limit, "resource")  # grpc's own message-size refusal
    return None


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Records ``rpc.server.call.duration``, ``helix.refusals`` and ``helix.stream.readers``.

    Health checks are left out: probes call them every few seconds and they say
    nothing about the work.
    """

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        full = handler_call_details.method
        # No handler: an unknown method, whose name the caller chose (not a label).
        if handler is None or full.startswith(HEALTH_PREFIX):
            return handler
        service, _, method = full.lstrip("/").rpartition("/")
        labels = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        streams = handler.response_streaming

        async def before(request: Any, context: _Context) -> Any:
            started = time.perf_counter()
            if streams:
                instruments().stream_readers.add(1, labels)
            done = functools.partial(_done, labels=labels, started=started, streams=streams)
            # The stubs want their own _DoneCallback class; grpc takes any callable.
            context.add_done_callback(cast(Any, done))
            return request

        return wrap_handler(handler, before=before)


def _done(context: _Context, *, labels: dict[str, str], started: float, streams: bool) -> None:
    """The call is over (answered, refused, failed or cancelled): record it."""
    record = instruments()
    if streams:
        record.stream_readers.add(-1, labels)
    code = _code(context)
    record.rpc_duration.record(
        time.perf_counter() - started, {**labels, "rpc.grpc.status_code": code.value[0]}
    )
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        limit = read_details(code, context.trailing_metadata()).reason
    else:
        limit = ""
    if (reason := refusal_reason(code, limit)) is not None:
        record.refusals.add(1, {"helix.refusal.reason": reason, "rpc.method": labels["rpc.method"]})


def _code(context: _Context) -> grpc.StatusCode:
    if context.cancelled():
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    # grpc.aio keeps the code as given (an int from the cython layer on some paths).
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.OK)
