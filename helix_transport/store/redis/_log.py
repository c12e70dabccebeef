"""The event log in a Redis store: ``events:{id}``, a stream whose entry ids are
``0-<sequence>``, under the store's prefix.

An append is one script that numbers the events, may apply a session update and save
a checkpoint, all atomically. The store translates the driver's errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis

from helix_transport._exceptions import SequenceConflict, SessionNotFound
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_page,
    given_bytes,
)
from helix_transport.store._records import Checkpoint, SessionUpdate
from helix_transport.store.redis._checkpoints import checkpoint_json
from helix_transport.store.redis._sessions import APPLY_UPDATE, update_args

# KEYS: session hash, event stream, and the checkpoint key when the append carries
# one. ARGV: expected sequence, append token, event count n, has-update flag,
# status set prefix, now, terminal flag, n payloads, the update's field/value pairs,
# and last the checkpoint's JSON when it carries one: all in one atomic write.
#
# The token makes a retried call safe: redis-py resends a command after a connection
# or timeout error, and if the first attempt had already landed, appending again
# would duplicate the events (or raise a false SequenceConflict). A token equal to
# the session's latest one means "this is that append", and no append came since.
_APPEND = (
    APPLY_UPDATE
    + """
local last = redis.call('HGET', KEYS[1], 'last_sequence')
if not last then return {'missing'} end
last = tonumber(last)
if redis.call('HGET', KEYS[1], 'append_token') == ARGV[2] then return {'ok', last} end
if tonumber(ARGV[1]) ~= last then return {'conflict', last} end
local n = tonumber(ARGV[3])
for i = 1, n do
  redis.call('XADD', KEYS[2], string.format('0-%d', last + i), 'event', ARGV[7 + i])
end
last = last + n
redis.call('HSET', KEYS[1], 'last_sequence', string.format('%d', last), 'append_token', ARGV[2])
local pairs_end = #ARGV
if #KEYS == 3 then
  redis.call('SET', KEYS[3], ARGV[#ARGV])
  pairs_end = #ARGV - 1
end
if ARGV[4] == '1' then apply_update(KEYS[1], ARGV[5], ARGV[6], ARGV[7], 8 + n, pairs_end) end
return {'ok', last}
"""
)

# KEYS: event stream. ARGV: from_sequence, count. A page as the events' bytes, each
# with its sequence (the entry id's) in front where it was stored without one: built
# in the server, where redis-py would make a dict per entry and the caller parse each.
# 'ok' then the bytes; 'gap' when the entries are not the ones right after
# from_sequence; 'restamp' when bytes hold another sequence (``read`` replaces it).
_READ_ENCODED = """
local after = tonumber(ARGV[1])
local entries = redis.call('XRANGE', KEYS[1], '(0-' .. ARGV[1], '+', 'COUNT', ARGV[2])
local n = #entries
if n == 0 then return {'ok'} end
-- Ids only increase: the first and the last tell whether these are the ones after it.
if entries[1][1] ~= string.format('0-%d', after + 1)
  or entries[n][1] ~= string.format('0-%d', after + n) then
  return {'gap'}
end
local out = {'ok'}
local char, floor, sub = string.char, math.floor, string.sub
for i = 1, n do
  local s = after + i
  local key
  if s < 128 then
    key = '\\8' .. char(s)
  elseif s < 16384 then
    key = '\\8' .. char(s % 128 + 128, floor(s / 128))
  else
    local t, v = {'\\8'}, s
    while v >= 128 do
      t[#t + 1] = char(v % 128 + 128)
      v = floor(v / 128)
    end
    t[#t + 1] = char(v)
    key = table.concat(t)
  end
  local data = entries[i][2][2]
  if sub(data, 1, #key) ~= key then
    if string.byte(data, 1) == 8 then return {'restamp'} end
    data = key .. data
  end
  out[i + 1] = data
end
return out
"""


class RedisEventLog:
    """``EventLogStore`` and ``EventNotifier`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._append = client.register_script(_APPEND)
        self._read_encoded = client.register_script(_READ_ENCODED)
        # A blocked XREAD must return before the client's own reply timeout fires.
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_cap_s = float(socket_timeout) / 2 if socket_timeout else 5.0

    async def append(
        self,
        session_id: str,
        events: Sequence[StreamEvent],
        *,
        expected_sequence: int,
        update: SessionUpdate | None = None,
        encoded: Sequence[bytes] | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> int:
        """Append ``events``, assigning their sequences in place (see ``Store.append``).

        When the append fails, the events keep the sequences they had before. A
        ``checkpoint`` is saved in the same atomic write.

        Raises:
            SessionNotFound: no such session.
            SequenceConflict: the log does not end at ``expected_sequence``.
        """
        # Sequences are assigned inside the script, after the events are serialized:
        # the entry id 0-<sequence> is the single source of truth, and ``read`` stamps
        # it back onto each event. So events are stored without one, or with the one
        # the writer's fence implies (``encoded``; a conflict stores nothing).
        given = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, given))
        # Before anything is written: a checkpoint that is not JSON stores nothing.
        saved = None if checkpoint is None else checkpoint_json(checkpoint)
        payloads = (
            list(given)
            if given is not None
            else [_serialize_unsequenced(event) for event in events]
        )
        head, pairs = update_args(self._prefix, update or SessionUpdate())
        args: list[str | bytes] = [
            str(expected_sequence),
            uuid.uuid4().hex,
            str(len(payloads)),
            "0" if update is None else "1",
            *head,
            *payloads,
            *pairs,  # the script finds them after the payloads
        ]
        keys = [self._key("session", session_id), self._key("events", session_id)]
        if saved is not None:
            args.append(saved)
            keys.append(self._key("checkpoint", session_id))
        answer = await self._append(keys=keys, args=args)
        if answer[0] == b"missing":
            raise SessionNotFound(session_id)
        last: int = answer[1]
        if answer[0] == b"conflict":
            raise SequenceConflict(session_id, expected_sequence, last)
        for offset, event in enumerate(events, start=last - len(events) + 1):
            event.sequence = offset
        return last

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``.

        An unknown session reads as an empty log.
        """
        count = min(limit, READ_LIMIT)
        if count < 1:
            return []
        # "(" makes the start exclusive: entries strictly after 0-<from_sequence>.
        start = f"(0-{max(from_sequence, 0)}"
        entries = await self._client.xrange(
            self._key("events", session_id), min=start, max="+", count=count
        )
        events = []
        for entry_id, fields in entries:
            event = StreamEvent.FromString(fields[b"event"])
            event.sequence = int(entry_id.split(b"-")[1])
            events.append(event)
        return events

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as bytes: an entry's id is its sequence, and its bytes hold
        that one already (the writer's) or none (put in front: field 1 leads).

        Raises:
            StoreError: the log there is not the events right after ``from_sequence``.
        """
        count = min(limit, READ_LIMIT)
        if count < 1:
            return []
        after = max(from_sequence, 0)
        reply: list[bytes] = await self._read_encoded(
            keys=[self._key("events", session_id)], args=[after, count]
        )
        if reply[0] == b"ok":
            del reply[0]
            return reply
        events = await self.read(session_id, from_sequence=after, limit=count)
        check_page(session_id, after, [event.sequence for event in events])
        return [event.SerializeToString() for event in events]

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Block on the session's stream (``XREAD BLOCK``) until it grows past ``from_sequence``."""
        # Stay under the client's reply timeout, or the blocked read itself times out.
        block_ms = max(1, int(min(timeout_s, self._block_cap_s) * 1000))
        found = await self._client.xread(
            {self._key("events", session_id): f"0-{max(from_sequence, 0)}"},
            count=1,
            block=block_ms,
        )
        return bool(found)

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}:{kind}:{name}"


def _serialize_unsequenced(event: StreamEvent) -> bytes:
    previous = event.sequence
    event.sequence = 0  # proto3 omits a zero field, so no stale sequence is stored
    try:
        return event.SerializeToString()
    finally:
        event.sequence = previous
