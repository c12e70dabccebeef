"""Refusing a Redis that keeps nothing on disk: its restart loses every session.

Checked once when a ``RedisStore`` connects (``RedisStore.from_url``). A Redis with
neither AOF (``appendonly yes``) nor RDB snapshots (``save`` rules) is refused unless
volatile data was allowed explicitly: ``--allow-volatile-store``,
``HELIX_ALLOW_VOLATILE_STORE=1``, ``ServerConfig.allow_volatile_store`` or
``open_store(url, allow_volatile=True)``. Where ``CONFIG GET`` is not allowed (managed
Redis renames or forbids it), a WARNING says persistence could not be checked.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from helix_transport._exceptions import UsageError
from helix_transport.config import Environment

logger = logging.getLogger("helix.store")

VOLATILE_STORE_ENV = "HELIX_ALLOW_VOLATILE_STORE"
"""Set to ``1`` to accept a store that keeps nothing on disk (tests, demos)."""


def volatile_allowed(allow_volatile: bool | None) -> bool:
    """``allow_volatile``, or ``HELIX_ALLOW_VOLATILE_STORE`` when it is ``None``."""
    if allow_volatile is not None:
        return allow_volatile
    return Environment().allow_volatile_store()


async def require_persistence(client: aioredis.Redis, where: str) -> None:
    """Refuse a Redis with neither AOF nor RDB snapshots.

    Raises:
        UsageError: the server persists nothing, naming the fix.
    """
    try:
        appendonly = _value(await client.config_get("appendonly"), "appendonly")
        save = _value(await client.config_get("save"), "save")
    except redis_errors.ResponseError as exc:  # CONFIG renamed, disabled or denied by ACL
        logger.warning(
            "could not check that the Redis store at %s persists its data (CONFIG GET: %s); "
            "make sure it has appendonly yes or save rules, or a restart loses every session",
            where,
            exc,
        )
        return
    if appendonly == "yes" or save.strip():
        return
    raise UsageError(
        f"refusing the Redis store at {where}: it keeps nothing on disk (appendonly no and "
        "no save rules), so a Redis restart would lose every session; turn on persistence "
        "(CONFIG SET appendonly yes, or save rules, with a volume for its data) or, for "
        "throwaway data, pass --allow-volatile-store (HELIX_ALLOW_VOLATILE_STORE=1)"
    )


def _value(reply: object, name: str) -> str:
    # A mapping {name: value}; bytes unless the client decodes responses.
    value = reply.get(name.encode(), reply.get(name, "")) if isinstance(reply, dict) else ""
    return value.decode() if isinstance(value, bytes) else str(value)
