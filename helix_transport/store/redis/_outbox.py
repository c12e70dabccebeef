"""The outbox of child commands in a Redis store.

Keys, under the store's prefix:

- ``commands``: a sorted set of every pending command's member, scored by ``created_at``.
- ``command:{member}``: a hash with one field per ``ChildCommand`` field.

A member is ``parent_session_id``, ``child_session_id`` and ``kind`` joined by NUL,
which no id may contain: members are unambiguous, and as Redis orders equal scores
by their bytes (UTF-8: code point order, NUL below everything), ``ZRANGE`` lists in
the order every backend promises. Writes touching both keys are one script or one
``MULTI``. The store translates the driver's errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from helix_transport.store._records import ChildCommand, merge_commands

# KEYS: the sorted set, then each command's hash. ARGV: per command, its member, then
# its fields in _FIELDS order. A command is pending while its member is in the set: a
# repeated one keeps its created_at (and score) and its attempts, and takes the new
# address and reason; a new one's hash is written whole. Redis keeps what a script
# wrote before an error, so a key of another type (foreign data) fails the batch first.
_PUT = """
for i = 1, #KEYS do
  local found = redis.call('TYPE', KEYS[i])['ok']
  local wanted = i == 1 and 'zset' or 'hash'
  if found ~= 'none' and found ~= wanted then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. found .. ', not a ' .. wanted)
  end
end
for i = 2, #KEYS do
  local a = (i - 2) * 8
  if redis.call('ZSCORE', KEYS[1], ARGV[a + 1]) then
    redis.call('HSET', KEYS[i], 'address', ARGV[a + 4], 'reason', ARGV[a + 6])
  else
    redis.call('HSET', KEYS[i], 'parent_session_id', ARGV[a + 2], 'child_session_id',
      ARGV[a + 3], 'address', ARGV[a + 4], 'kind', ARGV[a + 5], 'reason', ARGV[a + 6],
      'created_at', ARGV[a + 7], 'attempts', ARGV[a + 8])
    redis.call('ZADD', KEYS[1], ARGV[a + 7], ARGV[a + 1])
  end
end
"""

# KEYS: the sorted set. ARGV: limit, the hashes' key prefix. One snapshot of the set and
# its hashes (a command deleted between two reads would otherwise come back half).
_LIST = """
local found = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local fields = redis.call('HGETALL', ARGV[2] .. member)
  if #fields > 0 then table.insert(found, fields) end
end
return found
"""

# KEYS: the command's hash. HINCRBY alone would create a gone command's hash again.
_RECORD_ATTEMPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'attempts', 1) end
"""

_FIELDS = [f.name for f in dataclasses.fields(ChildCommand)]
assert _FIELDS == [  # the order _PUT's ARGV offsets assume
    "parent_session_id",
    "child_session_id",
    "address",
    "kind",
    "reason",
    "created_at",
    "attempts",
]


class RedisOutbox:
    """``OutboxStore`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._set = f"{prefix}:commands"
        self._hash_prefix = f"{prefix}:command:"
        self._put = client.register_script(_PUT)
        self._list = client.register_script(_LIST)
        self._record_attempt = client.register_script(_RECORD_ATTEMPT)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Upsert ``commands`` in one script (see ``OutboxStore.put_commands``)."""
        commands = merge_commands(commands)
        if not commands:
            return
        keys = [self._set, *(self._hash(command) for command in commands)]
        args: list[str] = []
        for command in commands:
            args += (_member(command), *(_encode(getattr(command, f)) for f in _FIELDS))
        await self._put(keys=keys, args=args)

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """At most ``limit`` commands, oldest first (``created_at``, then the member)."""
        if limit < 1:
            return []
        rows = await self._list(keys=[self._set], args=[limit, self._hash_prefix])
        return [_decode(row) for row in rows]

    async def record_attempt(self, command: ChildCommand) -> None:
        """``attempts += 1`` on the stored command with ``command``'s key, if any."""
        await self._record_attempt(keys=[self._hash(command)])

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop the stored command with ``command``'s key, if any."""
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._hash(command))
            pipe.zrem(self._set, _member(command))
            await pipe.execute()

    def _hash(self, command: ChildCommand) -> str:
        return self._hash_prefix + _member(command)


def _member(command: ChildCommand) -> str:
    return "\x00".join(command.key)


def _encode(value: object) -> str:
    # repr round-trips a float exactly; Redis reads it as the sorted set's score too.
    return repr(float(value)) if isinstance(value, float) else str(value)


def _decode(row: list[Any]) -> ChildCommand:
    """A command from ``HGETALL``'s flat list of field/value pairs."""
    fields: dict[str, Any] = {
        bytes(name).decode(): bytes(value).decode()
        for name, value in zip(row[::2], row[1::2], strict=True)
    }
    fields["created_at"] = float(fields["created_at"])
    fields["attempts"] = int(fields["attempts"])
    return ChildCommand(**fields)
