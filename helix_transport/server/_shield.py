"""Work that must finish once begun, whether or not its caller stays for the answer."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger("helix.server")

T = TypeVar("T")


async def outlive_caller(work: Coroutine[Any, Any, T], *, what: str) -> T:
    """``work``'s result, shielded from the caller's cancellation (an RPC it gave up on).

    Should ``work`` fail after its caller left, that failure is logged here, naming
    ``what``, rather than by asyncio as an exception never retrieved.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(functools.partial(_log_failure, what))
        raise


def _log_failure(what: str, task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("%s failed after its caller left", what, exc_info=error)
