"""The Redis store's Lua scripts: each a write that must be atomic."""

from __future__ import annotations

# Applies a SessionUpdate's encoded field/value pairs (ARGV[first..last]) to the session
# hash, moving the id between status sets, exactly as ``SessionUpdate.apply`` does.
_APPLY_UPDATE = """
local function apply_update(key, index_prefix, now, terminal, first, last)
  local status = redis.call('HGET', key, 'status')
  for i = first, last, 2 do
    if ARGV[i] == 'status' and ARGV[i + 1] ~= status then
      local id = redis.call('HGET', key, 'session_id')
      redis.call('SREM', index_prefix .. status, id)
      redis.call('SADD', index_prefix .. ARGV[i + 1], id)
    end
    redis.call('HSET', key, ARGV[i], ARGV[i + 1])
  end
  redis.call('HSET', key, 'updated_at', now)
  if terminal == '1' then
    redis.call('HSET', key, 'finished_at', now)
  end
end
"""

# KEYS: session hash, its status set, its owner's set (_redis_listing). ARGV: session
# id, lease ttl seconds or '', its member in the owner's set, field/value pairs. A
# lease's expiry is set by the server's clock, as in _ACQUIRE_LEASE.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 4))
  if ARGV[2] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    redis.call('HSET', KEYS[1], 'lease_expires_at', string.format('%.17g', now + tonumber(ARGV[2])))
  end
  redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], 0, ARGV[3])
  return {1, redis.call('HGETALL', KEYS[1])}
end
return {0, redis.call('HGETALL', KEYS[1])}
"""

# KEYS: session hash. ARGV: expected status or '', status set prefix, now, terminal
# flag, field/value pairs.
_UPDATE = (
    _APPLY_UPDATE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if ARGV[1] ~= '' and ARGV[1] ~= status then return {'mismatch'} end
apply_update(KEYS[1], ARGV[2], ARGV[3], ARGV[4], 5, #ARGV)
return {'ok', redis.call('HGETALL', KEYS[1])}
"""
)

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
    _APPLY_UPDATE
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

# KEYS: refs hash, order list. ARGV: child id, ref JSON. HSET answers 1 only for a
# new field, so a replaced ref keeps its place in the order.
_PUT_REF = """
if redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
"""

# KEYS: session hash. ARGV: owner, ttl seconds. The server's clock decides expiry, so
# replicas with skewed clocks still agree on when a lease has lapsed.
_ACQUIRE_LEASE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expires = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at'))
if owner ~= '' and owner ~= ARGV[1] and expires > now then return 0 end
local until_ = string.format('%.17g', now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_expires_at', until_)
return 1
"""

# KEYS: session hash. ARGV: owner.
_RELEASE_LEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', '', 'lease_expires_at', '0.0')
end
"""


# Writes the checkpoint only while the session's log ends where the writer thinks
# (the fencing token of a checkpoint); answers the log's actual end.
_SAVE_CHECKPOINT_LUA = """
local last = redis.call('HGET', KEYS[1], 'last_sequence')
if last and tonumber(last) ~= tonumber(ARGV[1]) then
  return tonumber(last)
end
redis.call('SET', KEYS[2], ARGV[2])
return tonumber(ARGV[1])
"""
