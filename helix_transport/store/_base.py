"""The state store contract every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from helix_transport._events import SessionStatus
from helix_transport._exceptions import StoreError, UsageError
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._listing import SessionPage, SessionQuery
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    storable_text,
)

READ_LIMIT = 1000
"""Default and maximum events one ``read`` returns."""


@runtime_checkable
class SessionStore(Protocol):
    """Session records: create once, read, update, list by status."""

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists; of concurrent creators exactly one wins.

        ``record`` is a fresh session: ``last_sequence`` 0. With ``lease_ttl_s``, the
        session is created leased to ``record.owner`` for that long, judged by the
        store's clock as ``acquire_lease`` judges it (its ``lease_expires_at`` is
        ignored): one atomic write where a create then a lease were two round trips.
        An existing session is returned untouched, lease and all.

        Returns:
            The stored record and whether this call created it. When the id exists,
            the existing record is returned unchanged with ``False``; the caller
            compares ``input_hash`` to decide between idempotent replay and conflict.
        """
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        ...

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``; with ``expected_status``, only if the status still matches.

        Returns:
            The updated record, or ``None`` when ``expected_status`` did not match.

        Raises:
            SessionNotFound: no such session.
        """
        ...

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status`` (used on start to find runs to resume)."""
        ...


@runtime_checkable
class SessionIndex(Protocol):
    """One owner's sessions, newest first, a page at a time (see ``_listing``)."""

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """Up to ``limit`` (at most ``LIST_LIMIT``; below 1: none) of the sessions
        ``query`` matches, in listing order, from an index on (owner, ``created_at``).
        A record without a principal is ``anonymous``'s."""
        ...


@runtime_checkable
class EventLogStore(Protocol):
    """Each session's gapless, sequence-numbered event log."""

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
        """Append ``events`` to the session's log, assigning their sequences.

        Sets ``sequence`` on each event in place (``last_sequence + 1`` onwards) and
        updates the session's ``last_sequence`` in the same atomic write, together
        with ``update`` when given (so a terminal event and a terminal status land
        together or not at all).

        Args:
            expected_sequence: fail unless the log currently ends at this sequence;
                a writer that owns the session passes its own last sequence, so a
                second writer is detected instead of interleaving. Required: every
                append is fenced.
            encoded: each event already serialized with
                the sequence it gets (``expected_sequence + 1`` onwards), as the
                event log's writer has them: the store keeps these bytes rather
                than serialize every event again. ``events`` may then be empty (the
                bytes are the events); when given, it holds as many events.
            checkpoint: a checkpoint taken where this append
                leaves the log (its ``last_sequence``), replacing the session's in the
                same atomic write: one round trip for a step's events, its record
                update and its checkpoint. Redis writes it right after, as
                ``save_checkpoint`` would.

        Returns:
            The sequence of the last appended event.

        Raises:
            SessionNotFound: no such session.
            SequenceConflict: the log does not end at ``expected_sequence``.
        """
        ...

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` events with ``sequence > from_sequence``, in order.

        ``limit`` is capped at ``READ_LIMIT``; a limit below 1 returns ``[]``. A page
        may hold fewer events than asked for while more follow (SQLite cuts one at
        4 MiB): only an empty page means there is nothing after ``from_sequence``.
        """
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Each session's latest checkpoint, fenced by its log."""

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log.

        When the session exists, the checkpoint is written only if the log ends at
        ``checkpoint.last_sequence`` (the writer flushed its events first): a paused
        old owner resuming after a takeover cannot overwrite the new owner's state.

        Raises:
            SequenceConflict: the log has moved past the checkpoint.
        """
        ...

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        ...


@runtime_checkable
class InterruptStore(Protocol):
    """Durable interrupt requests, one pending per session."""

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record a durable interrupt request for the session, replacing a pending one,
        except that a pending abort is never replaced by a plain interrupt (the abort
        and its reason stay). ``reason`` is free text, stored as ``storable_text``
        makes it."""
        ...

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Atomically read and clear the session's interrupt request.

        Returns:
            The request if one was pending, else ``None``.
        """
        ...


@runtime_checkable
class InputStore(Protocol):
    """People's answers to a session's requests for input (approvals, client tools).

    Keyed by (session id, request id); an answer is opaque text to the store (the
    run's JSON), stored as ``storable_text`` makes it, up to a few MiB.
    """

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one: (the stored answer, stored by
        this call). Atomic: of concurrent callers exactly one stores, and every caller
        gets that one's answer back.

        Raises:
            UsageError: ``request_id`` is empty or not storable text (rewriting an id
                would answer another request).
        """
        ...

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id ({} for none or an unknown session)."""
        ...


@runtime_checkable
class ChildRefStore(Protocol):
    """A parent's refs to its children (sub-sessions, local or remote)."""

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        ...

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        ...

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``.

        One keyed read: a parent fanning out to N children looks each one up
        without listing all N refs every time.
        """
        ...


@runtime_checkable
class OutboxStore(Protocol):
    """The outbox of commands a parent owes its children (interrupts to deliver)."""

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in the outbox, atomically for the batch.

        An upsert on (parent_session_id, child_session_id, kind): a repeated command
        keeps its first ``created_at`` and its ``attempts`` and takes the new
        ``address`` and ``reason``; so does a key repeated within ``commands``.
        Commands are kept until ``delete_command``, whatever happens to the sessions,
        but for retention: an expired parent's commands go with it.
        """
        ...

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands of every session, at most ``limit`` (below 1: ``[]``).

        Oldest first: by ``created_at``, then parent id, child id and kind, compared
        by code point (the same order on every backend).
        """
        ...

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery of the command with ``command``'s key
        (``attempts += 1``); a no-op when it is gone."""
        ...

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop the command with ``command``'s key (delivered); a no-op when it is gone."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Leases: which process should run a session (the fence is ``append``'s)."""

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the session's lease if it is free, lapsed or already ``owner``'s."""
        ...

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, in one round trip: the ids whose lease
        ``owner`` holds now. A missing session is not held (no error).

        A process renews all its runs' leases this way: one call each a third of a
        TTL, however many sessions it runs.
        """
        ...

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it."""
        ...


@runtime_checkable
class Store(
    SessionStore,
    SessionIndex,
    EventLogStore,
    CheckpointStore,
    InterruptStore,
    InputStore,
    ChildRefStore,
    OutboxStore,
    LeaseStore,
    Protocol,
):
    """Durable state of sessions: every role above, in one backend.

    A part of the library that needs one role asks for that role's protocol; a
    backend implements them all, and ``open_store`` returns a ``Store``.

    Every method is atomic on its own. Backends raise ``StoreError`` subclasses and
    translate their driver's exceptions at one boundary.

    Conventions every backend follows (the conformance suite checks them):

    - ``read`` of an unknown session returns ``[]``; ``update_session``, ``append``
      and ``acquire_lease`` raise ``SessionNotFound``; ``release_lease`` is a no-op.
    - Checkpoints, interrupt flags, answers, refs and child commands are keyed by
      session id and do not check that the session exists (a parent may record a ref
      before its child).
    - Records and events handed out are copies: mutating them changes nothing stored.
    - Leases only say who *should* run a session; writers also pass
      ``expected_sequence`` to ``append``, which is what actually stops a second writer.
    """

    async def aclose(self) -> None:
        """Release connections the store owns. Idempotent."""
        ...


@runtime_checkable
class EncodedEventReader(Protocol):
    """Optional: a backend that can hand out a page of its log as the bytes it keeps.

    A replaying reader sends events as bytes; a page parsed only to be serialized
    again cost more than the read itself (SQLite: 1.4 ms of a 1,000-event page's
    2.8 ms). ``follow`` uses this when the store has it, ``read`` otherwise.
    """

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page, each event serialized with its sequence: event ``i`` of the
        page is the one at ``from_sequence + 1 + i`` (the backend checks it, or
        builds the bytes so). Same limits as ``read``; an unknown session is ``[]``."""
        ...


@runtime_checkable
class EventNotifier(Protocol):
    """Optional: a backend that can wake a reader when *any* process appends.

    Readers in the writer's own process are woken by the in-process hub; this is
    what makes a live tail prompt across replicas (Redis ``XREAD BLOCK``, PostgreSQL
    ``LISTEN``). Backends without it are polled.
    """

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Return True once the log may hold events after ``from_sequence``, or
        False after ``timeout_s`` without any. Spurious True is allowed."""
        ...


@runtime_checkable
class InterruptLookup(Protocol):
    """Optional: a backend that says which of many sessions have an interrupt pending.

    A replica asks it about all its runs every poll interval, so that an ``Interrupt``
    taken by another replica (behind a Kubernetes Service, most are) stops a run
    mid-step, in a model call or a long tool, not at its next step boundary. Backends
    without it keep the step boundary.
    """

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` whose interrupt request is not taken yet, in one
        round trip (nothing is taken: ``take_interrupt`` still clears each)."""
        ...


async def pages(
    store: EventLogStore, session_id: str, *, from_sequence: int = 0
) -> AsyncIterator[list[StreamEvent]]:
    """Every event with ``sequence > from_sequence``, a page (``Store.read``) at a time.

    Only an empty page ends the log: a store may cut a page short (SQLite at 4 MiB),
    so a page of fewer than ``READ_LIMIT`` events is not the end.
    """
    while events := await store.read(session_id, from_sequence=from_sequence, limit=READ_LIMIT):
        yield events
        from_sequence = events[-1].sequence


def check_page(session_id: str, from_sequence: int, sequences: Sequence[int]) -> None:
    """Refuse a page of ``read_encoded`` that is not the events right after
    ``from_sequence`` (its bytes would be numbered wrong; it cannot happen to a log
    written through ``append``).

    Raises:
        StoreError: it is not.
    """
    first = from_sequence + 1
    if list(sequences) != list(range(first, first + len(sequences))):
        raise StoreError(
            f"the log of session {session_id!r} is not gapless after sequence {from_sequence}"
        )


def given_bytes(
    events: Sequence[StreamEvent], encoded: Sequence[bytes] | None
) -> Sequence[bytes] | None:
    """What ``append`` stores as given: ``encoded``, else None (the store serializes
    ``events`` once it has numbered them).

    Raises:
        UsageError: ``encoded`` is not one entry per event.
    """
    if encoded is None:
        return None
    if events and len(events) != len(encoded):
        raise UsageError(f"append: {len(events)} events but {len(encoded)} encoded")
    return encoded


def appended_count(events: Sequence[StreamEvent], given: Sequence[bytes] | None) -> int:
    """How many events an append adds: its bytes when ``given_bytes`` returned some."""
    return len(given) if given is not None else len(events)


def check_checkpoint(
    session_id: str, checkpoint: Checkpoint | None, expected_sequence: int, count: int
) -> None:
    """Refuse, before anything is written, a checkpoint ``append`` cannot fence.

    Raises:
        UsageError: the checkpoint is another session's, or it is not where the
            append leaves the log.
    """
    if checkpoint is None:
        return
    if checkpoint.session_id != session_id:
        # Fenced by this log, it would land beside, or over, another session's.
        raise UsageError(
            f"append to {session_id!r}: the checkpoint is session {checkpoint.session_id!r}'s"
        )
    if checkpoint.last_sequence != expected_sequence + count:
        raise UsageError(
            f"append: the checkpoint is at {checkpoint.last_sequence}, the append ends the "
            f"log at {expected_sequence + count}"
        )


def check_lease(record: SessionRecord, lease_ttl_s: float | None) -> None:
    """Refuse a ``create_session`` lease with no owner or no time.

    Raises:
        UsageError: ``lease_ttl_s`` given but not positive, or ``record.owner`` empty.
    """
    if lease_ttl_s is None:
        return
    if not record.owner:
        raise UsageError("create_session: a lease needs record.owner")
    if not lease_ttl_s > 0:
        raise UsageError(f"create_session: lease_ttl_s must be positive, not {lease_ttl_s}")


def storable_answer(request_id: str, answer_json: str) -> str:
    """``answer_json`` as ``put_answer`` stores it (``storable_text``), once
    ``request_id`` is known to be a key every backend keeps as given.

    Raises:
        UsageError: ``request_id`` is empty or holds NUL or a lone surrogate.
    """
    if not isinstance(request_id, str) or not request_id or storable_text(request_id) != request_id:
        raise UsageError(
            f"put_answer: the request id must be non-empty text without NUL or lone "
            f"surrogates, not {request_id!r}"
        )
    return storable_text(answer_json)
