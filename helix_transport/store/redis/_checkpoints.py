"""Checkpoints in a Redis store: ``checkpoint:{id}``, the checkpoint as a JSON string,
under the store's prefix. The store translates the driver's errors."""

from __future__ import annotations

import dataclasses
import json

import redis.asyncio as aioredis

from helix_transport._exceptions import SequenceConflict
from helix_transport.store._records import Checkpoint, Usage

# Writes the checkpoint only while the session's log ends where the writer thinks
# (the fencing token of a checkpoint); answers the log's actual end.
_SAVE_CHECKPOINT = """
local last = redis.call('HGET', KEYS[1], 'last_sequence')
if last and tonumber(last) ~= tonumber(ARGV[1]) then
  return tonumber(last)
end
redis.call('SET', KEYS[2], ARGV[2])
return tonumber(ARGV[1])
"""


class RedisCheckpoints:
    """``CheckpointStore`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._save = client.register_script(_SAVE_CHECKPOINT)

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        saved = checkpoint_json(checkpoint)
        keys = [
            f"{self._prefix}:session:{checkpoint.session_id}",
            self._key(checkpoint.session_id),
        ]
        actual = await self._save(keys=keys, args=[checkpoint.last_sequence, saved])
        if int(actual) != checkpoint.last_sequence:
            raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, int(actual))

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        raw = await self._client.get(self._key(session_id))
        if raw is None:
            return None
        data = json.loads(raw)
        data["usage"] = Usage(**data["usage"])
        return Checkpoint(**data)

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}:checkpoint:{session_id}"


def checkpoint_json(checkpoint: Checkpoint) -> str:
    """The checkpoint as stored; raises (``TypeError``) when it is not JSON."""
    return json.dumps(dataclasses.asdict(checkpoint))
