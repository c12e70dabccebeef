"""People's answers in a Redis store: ``answers:{id}``, a hash of the session's
answers by request id, under the store's prefix.

A write that reads first is one script. The store translates the driver's errors.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

import redis.asyncio as aioredis

from helix_transport.store._base import storable_answer

# KEYS: the answers hash. ARGV: request id, answer. Answers {1} when it stored, else
# {0, the stored answer} (the caller has its own answer: a MiB is not sent back).
_PUT_ANSWER = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then return {1} end
return {0, redis.call('HGET', KEYS[1], ARGV[1])}
"""


class RedisInputs:
    """``InputStore`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._put_answer = client.register_script(_PUT_ANSWER)

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Store the answer unless the request has one: (stored, by this call)."""
        answer = storable_answer(request_id, answer_json)
        found = await self._put_answer(keys=[self._answers(session_id)], args=[request_id, answer])
        if int(found[0]) == 1:
            return answer, True
        return bytes(found[1]).decode(), False

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        raw = await cast(
            "Awaitable[dict[bytes, bytes]]", self._client.hgetall(self._answers(session_id))
        )
        return {bytes(k).decode(): bytes(v).decode() for k, v in raw.items()}

    def _answers(self, session_id: str) -> str:
        return f"{self._prefix}:answers:{session_id}"
