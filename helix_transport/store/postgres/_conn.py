"""The PostgreSQL store's pool as its roles use it: connections with the driver's
errors translated at one boundary, transactions, and the schema put into statements."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from helix_transport._exceptions import StoreUnavailable, UsageError
from helix_transport.store.postgres._errors import is_lost, map_pg_errors


class Database:
    """``pool`` under ``schema``; ``where`` names it in errors. Closing is the store's:
    it sets ``closed`` and every later call is refused."""

    def __init__(self, pool: asyncpg.Pool, schema: str, acquire_timeout_s: float) -> None:
        self.pool = pool
        self.schema = schema
        self.quoted = f'"{schema}"'
        self.acquire_timeout_s = acquire_timeout_s
        self.where = "the injected pool"
        self.closed = False

    def q(self, template: str) -> str:
        """``template`` with ``{s}`` replaced by the quoted schema."""
        return template.replace("{s}", self.quoted)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection, with driver errors translated at this one boundary."""
        if self.closed:
            raise UsageError("PostgresStore is closed")
        with map_pg_errors(self.where):
            try:
                conn = await self.pool.acquire(timeout=self.acquire_timeout_s)
            except TimeoutError as exc:
                raise StoreUnavailable(
                    f"no PostgreSQL connection to {self.where} became free within "
                    f"{self.acquire_timeout_s:g}s (pool exhausted or server unresponsive)"
                ) from exc
            try:
                yield conn
            except asyncpg.InterfaceError as exc:
                # When the server drops a connection, the pool detaches it and later
                # calls fail with InterfaceError ("released back to the pool").
                if is_lost(conn):
                    raise StoreUnavailable(
                        f"PostgreSQL at {self.where}: lost the connection: {exc}"
                    ) from exc
                raise
            finally:
                # Pool.release shields itself, so a cancelled call still returns the
                # connection (rolled back and reset) instead of leaking it.
                await self.pool.release(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A pooled connection inside one transaction, committed when the block ends."""
        async with self.connection() as conn:
            # Not `async with conn.transaction()`: on a lost connection its rollback
            # replaces the real error with "the underlying connection is closed".
            transaction = conn.transaction()
            await transaction.start()
            try:
                yield conn
            except BaseException:
                # Best effort: release() resets or terminates the connection anyway,
                # and the error worth reporting is the one that got us here.
                with contextlib.suppress(Exception):
                    await transaction.rollback()
                raise
            await transaction.commit()

    async def call(self, method: str, template: str, *args: Any) -> Any:
        """One statement on a pooled connection; ``method`` names the asyncpg call."""
        async with self.connection() as conn:
            return await getattr(conn, method)(self.q(template), *args)
