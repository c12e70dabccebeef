"""Each backend's role objects implement the role protocols of ``store._base``: the
seams a backend is built from. mypy checks the signatures (the annotated assignments);
the test checks that the store composes nothing else."""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis

from helix_transport.store import (
    CheckpointStore,
    ChildRefStore,
    EventLogStore,
    EventNotifier,
    InputStore,
    InterruptLookup,
    InterruptStore,
    LeaseStore,
    OutboxStore,
    RetentionStore,
    SessionIndex,
    SessionStore,
)
from helix_transport.store import postgres as pg
from helix_transport.store import redis as rd
from helix_transport.store.postgres._checkpoints import PostgresCheckpoints
from helix_transport.store.postgres._conn import Database
from helix_transport.store.postgres._inputs import PostgresInputs
from helix_transport.store.postgres._interrupts import PostgresInterrupts
from helix_transport.store.postgres._leases import PostgresLeases
from helix_transport.store.postgres._listing import PostgresSessionIndex
from helix_transport.store.postgres._log import PostgresEventLog
from helix_transport.store.postgres._notifier import PostgresNotifier
from helix_transport.store.postgres._outbox import PostgresOutbox
from helix_transport.store.postgres._refs import PostgresChildRefs
from helix_transport.store.postgres._retention import PostgresRetention
from helix_transport.store.postgres._sessions import PostgresSessions
from helix_transport.store.redis._checkpoints import RedisCheckpoints
from helix_transport.store.redis._inputs import RedisInputs
from helix_transport.store.redis._interrupts import RedisInterrupts
from helix_transport.store.redis._leases import RedisLeases
from helix_transport.store.redis._listing import RedisSessionIndex
from helix_transport.store.redis._log import RedisEventLog
from helix_transport.store.redis._outbox import RedisOutbox
from helix_transport.store.redis._refs import RedisChildRefs
from helix_transport.store.redis._retention import RedisRetention
from helix_transport.store.redis._sessions import RedisSessions


def _roles_of(store: object) -> set[str]:
    """The attributes of ``store`` that hold role objects (all but the connection's)."""
    return {
        name
        for name, value in vars(store).items()
        if type(value).__name__.endswith(
            (
                "Sessions",
                "SessionIndex",
                "EventLog",
                "Notifier",
                "Checkpoints",
                "Leases",
                "Interrupts",
                "Inputs",
                "ChildRefs",
                "Outbox",
                "Retention",
            )
        )
    }


def test_redis_roles_implement_their_protocols() -> None:
    client = aioredis.Redis()  # no connection is made: nothing is sent
    index = RedisSessionIndex(client, "p")
    sessions: SessionStore = RedisSessions(client, "p", index)
    listing: SessionIndex = index
    log: EventLogStore = RedisEventLog(client, "p")
    notifier: EventNotifier = RedisEventLog(client, "p")
    checkpoints: CheckpointStore = RedisCheckpoints(client, "p")
    leases: LeaseStore = RedisLeases(client, "p")
    interrupts: InterruptStore = RedisInterrupts(client, "p")
    lookup: InterruptLookup = RedisInterrupts(client, "p")
    inputs: InputStore = RedisInputs(client, "p")
    refs: ChildRefStore = RedisChildRefs(client, "p")
    outbox: OutboxStore = RedisOutbox(client, "p")
    retention: RetentionStore = RedisRetention(client, "p", index.listed)
    pairs: list[tuple[object, type[Any]]] = [
        (sessions, SessionStore), (listing, SessionIndex), (log, EventLogStore),
        (notifier, EventNotifier), (checkpoints, CheckpointStore), (leases, LeaseStore),
        (interrupts, InterruptStore), (lookup, InterruptLookup), (inputs, InputStore),
        (refs, ChildRefStore), (outbox, OutboxStore), (retention, RetentionStore),
    ]  # fmt: skip
    for role, protocol in pairs:
        assert isinstance(role, protocol), (role, protocol)
    store = rd.RedisStore(client, prefix="p")
    assert _roles_of(store) == {
        "_sessions", "_index", "_log", "_checkpoints", "_leases", "_interrupts", "_inputs",
        "_refs", "_outbox", "_retention",
    }  # fmt: skip


def test_postgres_roles_implement_their_protocols() -> None:
    db = Database(cast(Any, None), "p", 1.0)  # roles keep the pool; none is needed here
    sessions: SessionStore = PostgresSessions(db)
    listing: SessionIndex = PostgresSessionIndex(db)
    log: EventLogStore = PostgresEventLog(db, "p_events")
    notifier: EventNotifier = PostgresNotifier(db, "p_events")
    checkpoints: CheckpointStore = PostgresCheckpoints(db)
    leases: LeaseStore = PostgresLeases(db)
    interrupts: InterruptStore = PostgresInterrupts(db)
    lookup: InterruptLookup = PostgresInterrupts(db)
    inputs: InputStore = PostgresInputs(db)
    refs: ChildRefStore = PostgresChildRefs(db)
    outbox: OutboxStore = PostgresOutbox(db)
    retention: RetentionStore = PostgresRetention(db)
    pairs: list[tuple[object, type[Any]]] = [
        (sessions, SessionStore), (listing, SessionIndex), (log, EventLogStore),
        (notifier, EventNotifier), (checkpoints, CheckpointStore), (leases, LeaseStore),
        (interrupts, InterruptStore), (lookup, InterruptLookup), (inputs, InputStore),
        (refs, ChildRefStore), (outbox, OutboxStore), (retention, RetentionStore),
    ]  # fmt: skip
    for role, protocol in pairs:
        assert isinstance(role, protocol), (role, protocol)
    store = pg.PostgresStore(cast(Any, None), schema="p")
    assert _roles_of(store) == {
        "_sessions", "_index", "_log", "_notifier", "_checkpoints", "_leases",
        "_interrupts", "_inputs", "_refs", "_outbox", "_retention",
    }  # fmt: skip
