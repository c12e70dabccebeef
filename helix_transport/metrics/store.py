"""Store latency, measured at one seam: a wrapper around whichever backend is open.

Every backend method stays as it is; ``metered_store`` hands the server a ``Store``
whose coroutine methods are the backend's, each timed into
``helix.store.operation.duration`` by backend and operation (the method's name).
The timed methods are made once, at wrapping, and set on the instance: a call costs
two clock reads and one record, and ``isinstance`` checks of the optional store
roles (``EventNotifier``, ``InterruptLookup``) see exactly what the backend has.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from opentelemetry.metrics import Histogram

from helix_transport.metrics.instruments import instruments
from helix_transport.store import Store

__all__ = ["UNTIMED", "MeteredStore", "backend_name", "metered_store"]

UNTIMED = frozenset({"wait_for_events", "aclose"})
"""Not latencies: ``wait_for_events`` blocks until an append elsewhere (a long poll),
``aclose`` happens once."""


def backend_name(store: object) -> str:
    """``sqlite`` for a ``SqliteStore``, and so on: the ``helix.store.backend`` label."""
    name = type(store).__name__.lower()
    return name.removesuffix("store") or name


class MeteredStore:
    """``store`` with its coroutine methods timed; anything else passes through."""

    def __init__(self, store: Store, *, backend: str) -> None:
        self.wrapped = store
        """The backend itself."""
        self.backend = backend
        histogram = instruments().store_duration
        for name in dir(store):
            if name.startswith("_") or name in UNTIMED:
                continue
            method = getattr(store, name, None)
            # Bound to the instance (not a classmethod such as ``open``) and async.
            if getattr(method, "__self__", None) is store and inspect.iscoroutinefunction(method):
                setattr(self, name, _timed(method, histogram, backend, name))

    def __getattr__(self, name: str) -> Any:
        # Only reached for what __init__ did not set: untimed methods, attributes.
        return getattr(self.wrapped, name)


def _timed(
    method: Callable[..., Awaitable[Any]], histogram: Histogram, backend: str, operation: str
) -> Callable[..., Awaitable[Any]]:
    ok = {"helix.store.backend": backend, "helix.store.operation": operation}
    clock = time.perf_counter

    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            result = await method(*args, **kwargs)
        except Exception as exc:
            failed = {**ok, "error.type": type(exc).__name__}
            histogram.record(clock() - started, failed)
            raise
        histogram.record(clock() - started, ok)
        return result

    return timed


def metered_store(store: Store) -> Store:
    """``store`` with every call timed (see the module's docstring)."""
    if isinstance(store, MeteredStore):
        return store
    return cast(Store, MeteredStore(store, backend=backend_name(store)))
