"""Listing one owner's sessions in the Redis store: a sorted set per owner.

``owned:{digest of tenant and principal}`` holds one member per session,
``{sortable created_at} {session_id}``, all with score 0: sorted by text, which is
newest-last, so ``ZREVRANGEBYLEX`` from a page's position walks it newest first and
exactly (no ties between floats to resolve). The create script adds the member with
the session; a session removed since is skipped and its member dropped. Stores written
before the index are indexed once, on the first listing (``owned-indexed`` marks it).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable
from typing import cast

import redis.asyncio as aioredis

from helix_transport._events import SessionStatus
from helix_transport.store._listing import (
    Position,
    SessionPage,
    SessionQuery,
    clamp,
    listed_principal,
    page_of,
    sortable_time,
    time_from_sortable,
)
from helix_transport.store._records import SessionRecord
from helix_transport.store.redis._codec import decode_session

BATCH = 200
"""Members read per round trip."""
SCAN_BUDGET = 5000
"""Members examined per listing at most: a filter that matches few sessions of many
returns a short page (with the position to go on from) instead of reading them all."""


def member(record: SessionRecord) -> str:
    """``record``'s member in its owner's set."""
    return f"{sortable_time(record.created_at)} {record.session_id}"


def _position(raw: bytes) -> Position:
    text = raw.decode()
    return (time_from_sortable(text[:16]), text[17:])


class RedisSessionIndex:
    """The owner sets of one Redis store (``prefix``); errors are the caller's to map."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._indexed = False

    def key(self, tenant: str, principal: str) -> str:
        """The set of (``tenant``, ``principal``)'s sessions."""
        owner = f"{len(tenant)}:{tenant}/{principal}"  # unambiguous, as Principal.key
        return f"{self._prefix}:owned:{hashlib.sha256(owner.encode()).hexdigest()[:32]}"

    def key_of(self, record: SessionRecord) -> str:
        """The set ``record`` belongs in."""
        return self.key(record.tenant, listed_principal(record))

    def listed(self, record: SessionRecord) -> tuple[str, str]:
        """``record``'s set and its member there (what retention removes with it)."""
        return self.key_of(record), member(record)

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """Up to ``limit`` sessions ``query`` matches (see ``SessionIndex``)."""
        limit = clamp(limit)
        if limit == 0:
            return SessionPage(records=[], next_after=None)
        await self._backfill()
        key = self.key(query.tenant, query.principal)
        bounds = ["+"]
        if query.after is not None:
            bounds.append(f"({sortable_time(query.after[0])} {query.after[1]}")
        if query.created_before is not None:
            bounds.append(f"({sortable_time(query.created_before)}")
        high: str | bytes = min(bounds, key=lambda b: "\U0010ffff" if b == "+" else b[1:])
        low = "-" if query.created_after is None else f"[{sortable_time(query.created_after)}"
        found: list[SessionRecord] = []
        examined = 0
        last = b""
        wanted = limit + 1  # without filters, one batch is the page (and whether more follow)
        while examined < SCAN_BUDGET:
            batch = await cast(
                "Awaitable[list[bytes]]",
                self._client.zrevrangebylex(key, high, low, start=0, num=wanted),
            )
            wanted = min(wanted * 2, BATCH)  # a filter dropped some: read further ahead
            if not batch:
                return page_of(found, limit)
            async with self._client.pipeline(transaction=False) as pipe:
                for raw in batch:
                    pipe.hgetall(f"{self._prefix}:session:{_position(raw)[1]}")
                rows = await pipe.execute()
            gone = [raw for raw, fields in zip(batch, rows, strict=True) if not fields]
            if gone:  # removed (expired) sessions: their members go too
                await cast("Awaitable[int]", self._client.zrem(key, *gone))
            for fields in rows:
                examined += 1
                if fields and query.matches(record := decode_session(fields)):
                    found.append(record)
                    if len(found) > limit:
                        return page_of(found, limit)
            last = batch[-1]
            high = b"(" + last
        return SessionPage(records=found, next_after=_position(last))

    async def _backfill(self) -> None:
        """Index, once per store, the sessions written before the index existed."""
        if self._indexed:
            return
        marker = f"{self._prefix}:owned-indexed"
        if not await cast("Awaitable[int]", self._client.exists(marker)):
            # Every session is in the set of its status (which older stores kept too):
            # reading those finds them all without scanning the server's keyspace.
            async for ids in self._every_session_id():
                async with self._client.pipeline(transaction=False) as pipe:
                    for session_id in ids:
                        pipe.hgetall(f"{self._prefix}:session:{session_id.decode()}")
                    rows = await pipe.execute()
                records = [decode_session(fields) for fields in rows if fields]
                async with self._client.pipeline(transaction=False) as pipe:
                    for record in records:
                        pipe.zadd(self.key_of(record), {member(record): 0})
                    await pipe.execute()
            await self._client.set(marker, b"1")
        self._indexed = True

    async def _every_session_id(self) -> AsyncIterator[list[bytes]]:
        for status in SessionStatus:
            key = f"{self._prefix}:status:{status.value}"
            scan_position = 0
            while True:
                scan_position, ids = await cast(
                    "Awaitable[tuple[int, list[bytes]]]",
                    self._client.sscan(key, scan_position, count=500),
                )
                if ids:
                    yield ids
                if scan_position == 0:
                    break
