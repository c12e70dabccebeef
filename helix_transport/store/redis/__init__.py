"""``RedisStore``: the shared store, Redis, for several replicas of a service working on one state.

Every key starts with the store's prefix (``{prefix}:...``):

- ``session:{id}``: a hash with one field per ``SessionRecord`` field.
- ``status:{status}``: a set of the session ids in that status (``list_sessions``).
- ``owned:{owner}``: each owner's sessions, newest last (``_listing``).
- ``events:{id}``: the session's log, a stream whose entry ids are ``0-<sequence>``.
- ``checkpoint:{id}``: the checkpoint as a JSON string.
- ``interrupt:{id}`` / ``interrupt-abort:{id}`` / ``answers:{id}``: ``_interrupts``, ``_inputs``.
- ``refs:{parent}`` / ``refs-order:{parent}``: refs by child id, and child ids in
  the order they were first stored.
- ``commands`` / ``command:{member}``: the outbox of child commands (``_outbox``).
- ``status:finished-at`` / ``expired:{id}``: retention (``_retention``).

Each write that touches more than one key, or reads before it writes, is one Lua
script, so it is atomic on the server without WATCH/MULTI round trips. Scripts touch
keys of several sessions (the status sets), so this needs a single Redis, not Redis
Cluster. Nor Sentinel: the store connects to one address and follows no failover.
"""

from __future__ import annotations

from helix_transport._optional import requires

# Every module of this package imports redis: a missing extra is named here, once.
with requires("redis", "the Redis store (redis://)"):
    import redis  # noqa: F401

from helix_transport.store.redis._store import RedisStore

__all__ = ["RedisStore"]
