"""What the store keeps: sessions, checkpoints, interrupts, sub-session refs, child commands."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport._limits import SessionLimits


def input_fingerprint(input_json: str) -> str:
    """A stable hash of an input, independent of key order and whitespace.

    Two ``Start`` calls with the same id are "the same" when their inputs parse to
    equal JSON values; this hash is what the store compares.
    """
    canonical = json.dumps(json.loads(input_json), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str) -> str:
    """``value`` with what not every store can hold replaced by U+FFFD: NUL (PostgreSQL's
    ``text`` refuses it) and lone surrogates (not UTF-8, so SQLite, Redis and protobuf
    refuse them). For free text made of others' messages, such as a provider's error:
    a run whose failure could not be written would never end."""
    return _UNSTORABLE.sub("\ufffd", value)


def _storable_fields(instance: object, *names: str) -> None:
    for name in names:
        value = getattr(instance, name)
        if value and _UNSTORABLE.search(value):
            object.__setattr__(instance, name, storable_text(value))  # frozen: at init only


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts reported by the model provider."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    """What the model calls cost in US dollars, where litellm knows the model's price."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True, kw_only=True)
class SessionRecord:
    """One session as the store keeps it."""

    session_id: str
    """Unique id of the session."""
    agent_type: str
    """The agent that runs it."""
    input_json: str
    """The input it was started with."""
    input_hash: str
    """``input_fingerprint(input_json)``: what idempotent ``Start`` compares."""
    status: SessionStatus = SessionStatus.RUNNING
    parent_session_id: str = ""
    """Empty for a root session."""
    metadata: dict[str, str] = field(default_factory=dict)
    output_json: str = ""
    """Set when completed."""
    error: str = ""
    """Set when failed: a message for people."""
    failure_reason: str = ""
    """Set when failed: a machine-readable reason (``max_steps``, ``model_error``...)."""
    step_count: int = 0
    """Steps the run loop has finished."""
    usage: Usage = field(default_factory=Usage)
    last_sequence: int = 0
    """Sequence of the last event in the session's log, kept by ``append``."""
    created_at: float = field(default_factory=time.time)
    """Seconds since the epoch, like every timestamp here."""
    updated_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    owner: str = ""
    """The process (replica id) holding the session's lease; empty when none."""
    lease_expires_at: float = 0.0
    """When the owner's lease lapses unless renewed."""
    principal: str = ""
    """Who started the session: the authenticated principal (``anonymous`` on a
    service without authentication). Only this principal of this tenant sees it.
    Empty on records written before sessions had owners: they count as anonymous's."""
    tenant: str = ""
    """The tenant of ``principal``."""
    deadline: float | None = None
    """``StartRequest.limits.deadline``: when the session must have answered."""
    budget_tokens: int | None = None
    """``StartRequest.limits.budget_tokens``: tokens its subtree may use."""
    budget_usd: float | None = None
    """``StartRequest.limits.budget_usd``: dollars its subtree may spend."""
    limit_exceeded: str = ""
    """``deadline_exceeded`` or ``budget_exceeded`` when a limit ended the latest turn."""

    @property
    def limits(self) -> SessionLimits:
        """The session's limits, as its ``Start`` set them."""
        return SessionLimits(
            deadline=self.deadline, budget_tokens=self.budget_tokens, budget_usd=self.budget_usd
        )


@dataclass(frozen=True, kw_only=True)
class SessionUpdate:
    """Fields to change on a session; ``None`` leaves a field as it is."""

    status: SessionStatus | None = None
    output_json: str | None = None
    error: str | None = None
    failure_reason: str | None = None
    step_count: int | None = None
    usage: Usage | None = None
    limit_exceeded: str | None = None

    def __post_init__(self) -> None:
        _storable_fields(self, "error", "failure_reason")

    def apply(self, record: SessionRecord, *, now: float) -> SessionRecord:
        """``record`` with this update applied (``updated_at``/``finished_at`` set)."""
        changes: dict[str, Any] = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        changes["updated_at"] = now
        if self.status is not None and self.status.is_terminal:
            changes["finished_at"] = now  # each turn's end: a continued session ends again
        return dataclasses.replace(record, **changes)


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Everything a restarted process needs to resume a run after ``step``."""

    session_id: str
    step: int
    """Steps completed; a resumed run starts at ``step + 1``."""
    messages: list[dict[str, Any]]
    """The model conversation so far (litellm/OpenAI chat format)."""
    usage: Usage = field(default_factory=Usage)
    last_sequence: int = 0
    """The log's last sequence when the checkpoint was taken."""
    state: dict[str, Any] = field(default_factory=dict)
    """Free-form run state (JSON-serialisable)."""


@dataclass(frozen=True, kw_only=True)
class SubSessionRef:
    """A parent's record of one of its children."""

    parent_session_id: str
    child_session_id: str
    agent_type: str
    tool_call_id: str
    status: SessionStatus = SessionStatus.RUNNING
    address: str = ""
    """The child service's address, for a remote child."""
    started_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    output_json: str = ""
    error: str = ""
    failure_reason: str = ""

    def __post_init__(self) -> None:
        _storable_fields(self, "error", "failure_reason")


@dataclass(frozen=True)
class Interrupt:
    """A pending interrupt request, as ``take_interrupt`` hands it out."""

    reason: str = ""
    """Why, free text ("" allowed)."""
    abort: bool = False
    """End the run (and its children) rather than stop its turn: a pending abort is
    never replaced by a plain interrupt, so a later "stop" cannot soften it."""


COMMAND_KINDS = frozenset({"interrupt", "abort", "close"})
"""The kinds of ``ChildCommand`` a parent may record (an ``abort`` is an interrupt
with ``abort=True`` cascading to a child; a ``close`` is an interrupt delivered once
the parent's session has ended, its close policy's); a kind no delivery loop knows
would wait in the outbox forever, so others are refused."""

_ATTEMPTS_MAX = 2**63 - 1
"""The most attempts every backend stores (SQLite's and PostgreSQL's 64-bit integers)."""


@dataclass(frozen=True, kw_only=True)
class ChildCommand:
    """An order for a child session, kept in its parent's store until the child's service takes it.

    Keyed by (``parent_session_id``, ``child_session_id``, ``kind``): one command of
    each kind per child. The ids, ``address`` and ``kind`` must be non-empty and
    storable text (``UsageError`` otherwise: rewriting an id would address another
    child); ``reason`` is free text, stored as ``storable_text`` makes it.
    """

    parent_session_id: str
    """The session whose store keeps the command."""
    child_session_id: str
    """The child session it is for, as the child's service knows it."""
    address: str
    """The child's service."""
    kind: str = "interrupt"
    """What to do, one of ``COMMAND_KINDS``."""
    reason: str = ""
    """Why, passed on to the child (an interrupt's reason)."""
    created_at: float = field(default_factory=time.time)
    """When the command was first recorded; a repeated command keeps the first time."""
    attempts: int = 0
    """Failed delivery attempts so far (for backoff and logs)."""

    def __post_init__(self) -> None:
        for name in ("parent_session_id", "child_session_id", "address", "kind"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or _UNSTORABLE.search(value):
                raise UsageError(
                    f"ChildCommand.{name} must be non-empty text without NUL or lone "
                    f"surrogates, not {value!r}"
                )
        if self.kind not in COMMAND_KINDS:
            raise UsageError(
                f"ChildCommand.kind {self.kind!r} is unknown: use one of {sorted(COMMAND_KINDS)}"
            )
        if not isinstance(self.created_at, int | float) or not math.isfinite(self.created_at):
            raise UsageError(
                f"ChildCommand.created_at must be a finite time, not {self.created_at!r}"
            )
        attempts = self.attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            raise UsageError(f"ChildCommand.attempts must be an integer, not {attempts!r}")
        if not 0 <= attempts <= _ATTEMPTS_MAX:
            raise UsageError(f"ChildCommand.attempts must be in 0..2**63-1, not {attempts}")
        _storable_fields(self, "reason")

    @property
    def key(self) -> tuple[str, str, str]:
        """(parent_session_id, child_session_id, kind): what identifies the command."""
        return (self.parent_session_id, self.child_session_id, self.kind)


def merge_commands(commands: Sequence[ChildCommand]) -> list[ChildCommand]:
    """``commands`` with repeated keys folded as if put one after another: one command
    per key, in first-seen order, with the first ``created_at`` and ``attempts`` and
    the last ``address`` and ``reason``. A batch upsert then touches each key once."""
    merged: dict[tuple[str, str, str], ChildCommand] = {}
    for command in commands:
        first = merged.get(command.key)
        merged[command.key] = (
            command
            if first is None
            else dataclasses.replace(first, address=command.address, reason=command.reason)
        )
    return list(merged.values())
