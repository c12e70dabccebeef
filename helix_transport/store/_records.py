"""What the store keeps: sessions, checkpoints, sub-session refs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from helix_transport._status import SessionStatus


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

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
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


@dataclass(frozen=True, kw_only=True)
class SessionUpdate:
    """Fields to change on a session; ``None`` leaves a field as it is."""

    status: SessionStatus | None = None
    output_json: str | None = None
    error: str | None = None
    failure_reason: str | None = None
    step_count: int | None = None
    usage: Usage | None = None

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
class RemoteCursor:
    """Where a parent is in a remote child's stream."""

    stream_id: str
    """The child's session id on the remote service."""
    last_sequence: int = 0
    """The last child sequence the parent has recorded."""


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
    remote: RemoteCursor | None = None
    output_json: str = ""
    error: str = ""
    failure_reason: str = ""

    def __post_init__(self) -> None:
        _storable_fields(self, "error", "failure_reason")
