"""An in-process store for tests and single-process demos; nothing survives a restart."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SequenceConflict, SessionNotFound, UsageError
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_lease,
    check_page,
    given_bytes,
    storable_answer,
)
from helix_transport.store._listing import SessionPage, SessionQuery, clamp, page_of, position
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    merge_commands,
    storable_text,
)
from helix_transport.store._retention import Candidate, Tombstone, expirable, finished_by


@dataclasses.dataclass(slots=True)
class _Log:
    """A session's events, serialized, in sequence order: ``data[i]`` is event
    ``after + 1 + i``. Bytes in one list, not a (sequence, bytes) tuple per event: the
    tuples were the store's garbage-collector work (a collection every 7 appends of
    100 events, tracing each one once)."""

    after: int
    """The log's last sequence when the session was created (events start after it)."""
    data: list[bytes] = dataclasses.field(default_factory=list)

    def page(self, from_sequence: int, limit: int) -> list[bytes]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``."""
        start = max(from_sequence - self.after, 0)
        return self.data[start : start + max(min(limit, READ_LIMIT), 0)]


_NO_LOG = _Log(after=0)


def _own(record: SessionRecord) -> SessionRecord:
    """A copy of ``record`` that shares nothing mutable with it. A record is frozen and
    every field but ``metadata`` is immutable (text, numbers, an enum, a frozen
    ``Usage``), so only that dict is copied: a deep copy walked every field, three
    times on each Start's path."""
    copied = object.__new__(type(record))
    copied.__dict__.update(record.__dict__)
    copied.__dict__["metadata"] = dict(record.metadata)
    return copied


class MemoryStore:
    """A ``Store`` kept in dictionaries.

    Atomicity comes from asyncio itself: no method awaits between reading and
    writing its state, so no other coroutine can run in between. (Not thread-safe;
    use one store per event loop.)

    Callers never share mutable objects with the store: a record's one mutable field
    (its metadata dict) is copied in and out (``_own``), sub-session refs are frozen
    with immutable fields (shared as they are), events are kept serialized, and
    checkpoints are kept as JSON, so a checkpoint that a durable backend could not
    store fails here too.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, SessionRecord] = {}
        self._events: dict[str, _Log] = {}
        self._checkpoints: dict[str, str] = {}
        self._interrupts: dict[str, Interrupt] = {}
        self._answers: dict[str, dict[str, str]] = {}
        # Dicts keep insertion order and replacing a key keeps its slot, which is
        # exactly the "order first stored" the Protocol asks of sub-session refs.
        self._refs: dict[str, dict[str, SubSessionRef]] = {}
        self._commands: dict[tuple[str, str, str], ChildCommand] = {}
        self._tombstones: dict[str, Tombstone] = {}
        self._closed = False

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        self._check_open()
        check_lease(record, lease_ttl_s)
        existing = self._sessions.get(record.session_id)
        if existing is not None:
            return _own(existing), False
        if lease_ttl_s is not None:
            record = dataclasses.replace(record, lease_expires_at=time.time() + lease_ttl_s)
        self._sessions[record.session_id] = _own(record)
        self._events[record.session_id] = _Log(after=record.last_sequence)
        return _own(record), True

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        self._check_open()
        record = self._sessions.get(session_id)
        return None if record is None else _own(record)

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``, optionally only while the status matches.

        Raises:
            SessionNotFound: no such session.
        """
        record = self._require_session(session_id)
        if expected_status is not None and record.status != expected_status:
            return None
        updated = update.apply(record, now=time.time())
        self._sessions[session_id] = updated
        return _own(updated)

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``."""
        self._check_open()
        return [_own(r) for r in self._sessions.values() if r.status == status]

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first (a sort of them all: for tests)."""
        self._check_open()
        rows = sorted(filter(query.matches, self._sessions.values()), key=position, reverse=True)
        return page_of([_own(r) for r in rows[: clamp(limit) + 1]], clamp(limit))

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

        Raises:
            SessionNotFound: no such session.
            SequenceConflict: the log does not end at ``expected_sequence``.
        """
        data = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, data))
        # Before anything changes: a checkpoint that is not JSON stores nothing.
        saved = None if checkpoint is None else json.dumps(_checkpoint_to_json(checkpoint))
        record = self._require_session(session_id)
        last = record.last_sequence
        if expected_sequence != last:
            raise SequenceConflict(session_id, expected_sequence, last)
        for sequence, event in enumerate(events, last + 1):
            event.sequence = sequence
        if data is None:
            data = [event.SerializeToString() for event in events]
        self._events[session_id].data += data
        last += len(data)
        if update is not None:
            record = update.apply(record, now=time.time())
        self._sessions[session_id] = _with_last_sequence(record, last)
        if saved is not None:
            self._checkpoints[session_id] = saved
        return last

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``.

        An unknown session reads as an empty log.
        """
        self._check_open()
        page = self._events.get(session_id, _NO_LOG).page(from_sequence, limit)
        return [StreamEvent.FromString(data) for data in page]

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as the bytes kept, each with its sequence (see
        ``EncodedEventReader``)."""
        self._check_open()
        log = self._events.get(session_id, _NO_LOG)
        page = log.page(from_sequence, limit)
        if page and from_sequence < log.after:  # before the log's first event: not after it
            check_page(session_id, from_sequence, range(log.after + 1, log.after + 1 + len(page)))
        return page

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        self._check_open()
        record = self._sessions.get(checkpoint.session_id)
        if record is not None and record.last_sequence != checkpoint.last_sequence:
            raise SequenceConflict(
                checkpoint.session_id, checkpoint.last_sequence, record.last_sequence
            )
        self._checkpoints[checkpoint.session_id] = json.dumps(_checkpoint_to_json(checkpoint))

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        self._check_open()
        data = self._checkpoints.get(session_id)
        return None if data is None else _checkpoint_from_json(session_id, json.loads(data))

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        self._check_open()
        pending = self._interrupts.get(session_id)
        if pending is None or abort or not pending.abort:
            self._interrupts[session_id] = Interrupt(storable_text(reason), abort=bool(abort))

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request."""
        self._check_open()
        return self._interrupts.pop(session_id, None)

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (see ``InputStore``)."""
        self._check_open()
        answer = storable_answer(request_id, answer_json)
        answers = self._answers.setdefault(session_id, {})
        if request_id in answers:
            return answers[request_id], False
        answers[request_id] = answer
        return answer, True

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        self._check_open()
        return dict(self._answers.get(session_id, {}))

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        self._check_open()
        return {session_id for session_id in session_ids if session_id in self._interrupts}

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        self._check_open()
        refs = self._refs.setdefault(ref.parent_session_id, {})
        refs[ref.child_session_id] = ref

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        self._check_open()
        return list(self._refs.get(parent_session_id, {}).values())

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        self._check_open()
        return self._refs.get(parent_session_id, {}).get(child_session_id)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` (an upsert keeping the first ``created_at``; see ``Store``)."""
        self._check_open()
        for command in merge_commands(commands):
            first = self._commands.get(command.key)
            if first is not None:
                command = dataclasses.replace(first, address=command.address, reason=command.reason)
            self._commands[command.key] = command

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        self._check_open()
        ordered = sorted(self._commands.values(), key=lambda c: (c.created_at, c.key))
        return ordered[: max(limit, 0)]

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        self._check_open()
        stored = self._commands.get(command.key)
        if stored is not None:
            self._commands[command.key] = dataclasses.replace(stored, attempts=stored.attempts + 1)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        self._check_open()
        self._commands.pop(command.key, None)

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Raises:
            SessionNotFound: no such session.
        """
        record = self._require_session(session_id)
        now = time.time()
        if record.owner and record.owner != owner and record.lease_expires_at > now:
            return False
        self._sessions[session_id] = dataclasses.replace(
            record, owner=owner, lease_expires_at=now + ttl_s
        )
        return True

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id: the ids whose lease ``owner`` holds now."""
        self._check_open()
        held = set()
        for session_id in session_ids:
            if session_id in self._sessions and await self.acquire_lease(
                session_id, owner, ttl_s=ttl_s
            ):
                held.add(session_id)
        return held

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        self._check_open()
        record = self._sessions.get(session_id)
        if record is not None and record.owner == owner:
            self._sessions[session_id] = dataclasses.replace(record, owner="", lease_expires_at=0.0)

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        self._check_open()
        found = sorted(
            (r.finished_at or 0.0, r.session_id)
            for r in self._sessions.values()
            if finished_by(r, finished_before)
        )
        keys = [key for key in found if after is None or key > after][: max(limit, 0)]
        return [_own(self._sessions[session_id]) for _, session_id in keys]

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, with everything keyed by them."""
        self._check_open()
        removed, now = [], time.time()
        for each in candidates:
            record = self._sessions.get(each.session_id)
            root = self._sessions.get(each.root_session_id)
            if record is None or not expirable(
                record, root, root_session_id=each.root_session_id, finished_before=finished_before
            ):
                continue
            sid = each.session_id
            keyed: dict[str, Any]
            for keyed in (
                self._sessions,
                self._events,
                self._checkpoints,
                self._interrupts,
                self._answers,
            ):
                keyed.pop(sid, None)
            self._refs.pop(sid, None)
            for key in [key for key in self._commands if key[0] == sid]:
                del self._commands[key]
            self._tombstones[sid] = Tombstone(
                session_id=sid,
                expired_at=now,
                kept_until=now + keep_tombstone_s,
                principal=record.principal,
                tenant=record.tenant,
            )
            removed.append(sid)
        return removed

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        self._check_open()
        tombstone = self._tombstones.get(session_id)
        return tombstone if tombstone is not None and tombstone.kept_until > time.time() else None

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before."""
        self._check_open()
        old = [t.session_id for t in self._tombstones.values() if t.kept_until <= kept_until]
        for session_id in old[: max(limit, 0)]:
            del self._tombstones[session_id]
        return min(len(old), max(limit, 0))

    async def aclose(self) -> None:
        """Mark the store closed; later calls raise ``UsageError``. Idempotent."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("MemoryStore is closed")

    def _require_session(self, session_id: str) -> SessionRecord:
        self._check_open()
        record = self._sessions.get(session_id)
        if record is None:
            raise SessionNotFound(session_id)
        return record


def _with_last_sequence(record: SessionRecord, last_sequence: int) -> SessionRecord:
    """``dataclasses.replace(record, last_sequence=...)`` without its walk over every
    field (a record has about 25): once per append."""
    copied = object.__new__(type(record))
    copied.__dict__.update(record.__dict__)
    copied.__dict__["last_sequence"] = last_sequence
    return copied


def _checkpoint_to_json(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "step": checkpoint.step,
        "messages": checkpoint.messages,
        "usage": dataclasses.asdict(checkpoint.usage),
        "last_sequence": checkpoint.last_sequence,
        "state": checkpoint.state,
    }


def _checkpoint_from_json(session_id: str, data: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        session_id=session_id,
        step=data["step"],
        messages=data["messages"],
        usage=Usage(**data["usage"]),
        last_sequence=data["last_sequence"],
        state=data["state"],
    )
