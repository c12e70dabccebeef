"""A parent's refs to its children in a Redis store.

Keys, under the store's prefix: ``refs:{parent}``, a hash of ref JSON by child id, and
``refs-order:{parent}``, the child ids in the order they were first stored. The store
translates the driver's errors.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable
from typing import cast

import redis.asyncio as aioredis

from helix_transport._events import SessionStatus
from helix_transport.store._records import SubSessionRef

# KEYS: refs hash, order list. ARGV: child id, ref JSON. HSET answers 1 only for a
# new field, so a replaced ref keeps its place in the order.
_PUT_REF = """
if redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
"""


class RedisChildRefs:
    """``ChildRefStore`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._put_ref = client.register_script(_PUT_REF)

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        parent = ref.parent_session_id
        keys = [self._key("refs", parent), self._key("refs-order", parent)]
        await self._put_ref(keys=keys, args=[ref.child_session_id, _ref_to_json(ref)])

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        # MULTI/EXEC so the order and the refs are one snapshot.
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.lrange(self._key("refs-order", parent_session_id), 0, -1)
            pipe.hgetall(self._key("refs", parent_session_id))
            order, refs = await pipe.execute()
        return [_ref_from_json(refs[child]) for child in order]

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        raw = await cast(
            "Awaitable[bytes | None]",
            self._client.hget(self._key("refs", parent_session_id), child_session_id),
        )
        return None if raw is None else _ref_from_json(raw)

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}:{kind}:{name}"


def _ref_to_json(ref: SubSessionRef) -> str:
    return json.dumps(dataclasses.asdict(ref))


def _ref_from_json(raw: bytes) -> SubSessionRef:
    data = json.loads(raw)
    data["status"] = SessionStatus(data["status"])
    data.pop("remote", None)  # a cursor refs written before carried; nothing read it
    return SubSessionRef(**data)
