"""Interrupt requests (with abort) in a Redis store.

Keys, under the store's prefix:

- ``interrupt:{id}``: a pending interrupt's reason (``pending_interrupts`` reads these).
- ``interrupt-abort:{id}``: ``1`` while the pending interrupt is an abort. A key of its
  own, so the reason key stays what it was and a process that predates aborts still
  reads and takes interrupts; an abort is pending only while both keys are.

Writes that read first are one script each. The store translates the driver's errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from helix_transport.store._records import Interrupt, storable_text

# KEYS: reason, abort flag. ARGV: reason, '1' for an abort. A plain interrupt leaves a
# pending abort (both keys there) as it is; else it replaces whatever was pending.
_SET_INTERRUPT = """
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], '1')
elseif redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
"""

# KEYS: reason, abort flag. Answers {reason, abort} or nil, and clears both.
_TAKE_INTERRUPT = """
local reason = redis.call('GET', KEYS[1])
local abort = redis.call('EXISTS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
if not reason then return false end
return {reason, abort}
"""


class RedisInterrupts:
    """``InterruptStore`` and ``InterruptLookup`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._set_interrupt = client.register_script(_SET_INTERRUPT)
        self._take_interrupt = client.register_script(_TAKE_INTERRUPT)

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record the request (see ``InterruptStore.set_interrupt``)."""
        args: list[str | int] = [storable_text(reason), int(abort)]
        await self._set_interrupt(keys=self._keys(session_id), args=args)

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's request, in one script."""
        found = await self._take_interrupt(keys=self._keys(session_id))
        if found is None:
            return None
        reason, abort = found
        return Interrupt(bytes(reason).decode(), abort=int(abort) == 1)

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken request (one ``MGET``)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        values = await self._client.mget([self._keys(i)[0] for i in ids])
        return {i for i, value in zip(ids, values, strict=True) if value is not None}

    def _keys(self, session_id: str) -> list[str]:
        return [
            f"{self._prefix}:interrupt:{session_id}",
            f"{self._prefix}:interrupt-abort:{session_id}",
        ]
