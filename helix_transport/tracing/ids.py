"""Deterministic trace and span ids: a session's trace is a function of its root
session id, a delegation span's id a function of its child session id, so a run
resumed in any process lands in the same trace and finds the same parents."""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator


def trace_id_for(root_session_id: str) -> int:
    """The trace id of a root session: the first 16 bytes of sha256(session id)."""
    value = int.from_bytes(hashlib.sha256(root_session_id.encode()).digest()[:16], "big")
    return value or 1


def span_id_for(key: str) -> int:
    """A deterministic span id (the delegation span of a child session)."""
    value = int.from_bytes(hashlib.sha256(f"span:{key}".encode()).digest()[:8], "big")
    return value or 1


_FORCED_IDS: contextvars.ContextVar[tuple[int | None, int | None]] = contextvars.ContextVar(
    "helix_forced_ids", default=(None, None)
)


class Ids(IdGenerator):
    """Random ids, unless ``forced_ids`` asks for given ones (the SDK asks for a trace
    id only for a span without a parent)."""

    _random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return _FORCED_IDS.get()[1] or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return _FORCED_IDS.get()[0] or self._random.generate_trace_id()


@contextmanager
def forced_ids(*, trace_id: int | None = None, span_id: int | None = None) -> Iterator[None]:
    token = _FORCED_IDS.set((trace_id, span_id))
    try:
        yield
    finally:
        _FORCED_IDS.reset(token)
