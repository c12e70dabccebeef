"""google.rpc rich error details on the wire, both ways.

A status's machine-readable details (``BadRequest`` field violations, ``RetryInfo``)
travel in the ``grpc-status-details-bin`` trailer as a serialized
``google.rpc.Status``, the convention every gRPC language reads (Go's
``status.FromError``, Java's ``StatusProto``, Node's ``@grpc/grpc-js`` helpers).
The status message stays a readable ``field: problem`` line for people.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DETAILS_KEY = "grpc-status-details-bin"

Metadata = tuple[tuple[str, str | bytes], ...]

# gRPC fails a call whose metadata passes 16 KiB (at random from 8 KiB), status
# included, so a status built from a caller's input (a field path holding their
# dict keys, say) is cut to stay well below: its own code, never RESOURCE_EXHAUSTED.
MAX_MESSAGE = 1024
MAX_FIELD = 256
MAX_DESCRIPTION = 512
MAX_VIOLATIONS_SIZE = 4096
"""Characters of field violations sent; the rest are counted, not listed."""


def cut(text: str, most: int = MAX_MESSAGE) -> str:
    """``text``, shortened to ``most`` characters with an ellipsis."""
    return text if len(text) <= most else text[: most - 1] + "…"


SESSION_EXPIRED = "session_expired"
"""``ErrorInfo.reason`` of a ``NOT_FOUND`` for a session retention removed."""
REQUEST_NOT_FOUND = "request_not_found"
"""``ErrorInfo.reason`` of a ``NOT_FOUND`` for a request for input (``SubmitInput``)."""


def trailing_metadata(
    code: grpc.StatusCode,
    message: str,
    *,
    violations: Sequence[tuple[str, str]] = (),
    retry_after_s: float | None = None,
    reason: str = "",
) -> Metadata:
    """The trailer carrying ``code``/``message`` and the given details."""
    details: list[any_pb2.Any] = []
    if violations:
        bad = error_details_pb2.BadRequest()
        size = 0
        for listed, (field, problem) in enumerate(violations):
            field, problem = cut(field, MAX_FIELD), cut(problem, MAX_DESCRIPTION)
            size += len(field) + len(problem)
            if size > MAX_VIOLATIONS_SIZE:
                more = f"{len(violations) - listed} more problems"
                bad.field_violations.add(field="", description=more)
                break
            bad.field_violations.add(field=field, description=problem)
        details.append(_pack(bad))
    if retry_after_s is not None:
        delay = duration_pb2.Duration()
        seconds = max(retry_after_s, 0.0)
        delay.FromNanoseconds(math.ceil(seconds * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    if reason:
        details.append(_pack(error_details_pb2.ErrorInfo(reason=reason, domain="helix-mesh")))
    status = status_pb2.Status(code=code.value[0], message=cut(message), details=details)
    return tuple(rpc_status.to_status(status).trailing_metadata)


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


@dataclass(frozen=True)
class RichDetails:
    """What a failed call's rich status said (empty when it said nothing)."""

    violations: tuple[tuple[str, str], ...] = ()
    """``BadRequest`` field violations, as ``(field, description)``."""
    retry_after_s: float | None = None
    """``RetryInfo.retry_delay``, in seconds."""
    reason: str = ""
    """``ErrorInfo.reason`` (e.g. ``rate_limit``)."""


def read_details(code: grpc.StatusCode, metadata: Iterable[tuple[str, Any]] | None) -> RichDetails:
    """The rich details of a failed call's trailer; ignores one that disagrees with ``code``."""
    raw = next((v for k, v in metadata or () if k == DETAILS_KEY), None)
    if not isinstance(raw, bytes):
        return RichDetails()
    try:
        status = status_pb2.Status.FromString(raw)
    except Exception:  # a malformed trailer from a foreign server: no details, not a crash
        return RichDetails()
    if status.code != code.value[0] or status.code == code_pb2.OK:
        return RichDetails()
    violations: list[tuple[str, str]] = []
    retry_after_s: float | None = None
    reason = ""
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            retry_after_s = info.retry_delay.ToNanoseconds() / 1e9
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            error = error_details_pb2.ErrorInfo()
            detail.Unpack(error)
            reason = error.reason
    return RichDetails(tuple(violations), retry_after_s, reason)
