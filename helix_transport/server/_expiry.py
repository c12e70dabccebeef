"""Retention on a server: the periodic sweep, and ``NOT_FOUND`` that says "expired"."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from helix_transport._exceptions import SessionExpired, SessionNotFound, StoreError, UsageError
from helix_transport.server._identity import ANONYMOUS, current_principal
from helix_transport.store import RetentionStore, Store, sweep

logger = logging.getLogger("helix.retention")

_MIN_INTERVAL_S = 1.0
_MAX_INTERVAL_S = 300.0


def sweep_interval_s(retention: timedelta) -> float:
    """How often a replica sweeps: a tenth of the retention, between 1 s and 5 min (a
    sweep with nothing to remove is one indexed query)."""
    return min(max(retention.total_seconds() / 10, _MIN_INTERVAL_S), _MAX_INTERVAL_S)


async def sweep_periodically(store: Store, retention: timedelta) -> None:
    """Sweep ``store`` every ``sweep_interval_s`` until cancelled; a failed sweep (the
    store down) is logged and tried again at the next interval."""
    interval_s = sweep_interval_s(retention)
    while True:
        try:
            report = await sweep(store, retention=retention)
        except StoreError as exc:
            logger.warning("retention sweep failed, retrying in %.0fs: %s", interval_s, exc)
        else:
            if report.expired:
                logger.info("retention: removed %d expired session(s)", len(report.expired))
        await asyncio.sleep(interval_s)


def retention_store(store: Store) -> RetentionStore:
    """``store`` as a ``RetentionStore`` (checked when a server starts).

    Raises:
        UsageError: the store cannot remove sessions (a wrapper that hides the role).
    """
    if not isinstance(store, RetentionStore):
        raise UsageError(f"{type(store).__name__} cannot expire sessions (no retention role)")
    return store


async def not_found(store: Store, key: str, session_id: str) -> SessionNotFound:
    """The error for a session the caller cannot find under ``key``: ``SessionExpired``
    when its tombstone is there and the caller owned it, else ``SessionNotFound``."""
    if isinstance(store, RetentionStore):
        tombstone = await store.get_tombstone(key)
        caller = current_principal()
        if (
            tombstone is not None
            and (tombstone.principal or ANONYMOUS.name) == caller.name
            and tombstone.tenant == caller.tenant
        ):
            return SessionExpired(session_id, tombstone.expired_at)
    return SessionNotFound(session_id)
