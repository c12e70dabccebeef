"""The library's own state of a run, kept apart from the state its tools see.

A run has two states, both saved with every checkpoint: ``ToolContext.state``, the
user's tools' free-form dict, and ``RunState``, the library's bookkeeping: which turn
the run is in, and one typed record per extension (inputs, companions, dispatch,
delegation spans), each a field. The records' types live here, beside ``RunState``,
so that the run loop can hold them without importing the delegation tools that use
them. They travel
in one JSON object, the checkpoint's ``state``: the run state under the one reserved key
``RUN_STATE_KEY``, which ``split_state`` takes out before tools see the dict and
``joined_state`` puts back when saving. One key in an existing field rather than a new
field of ``Checkpoint``: every backend already stores that JSON, so no schema changes.

A checkpoint written before this module (the library's keys as ``"helix.*"`` entries
among the user's) is migrated when loaded: those keys move into the run state.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RUN_STATE_KEY = "helix.run"
"""The key of the checkpoint's ``state`` that holds the run state. ``helix.`` keys were
the library's before, so no user key takes this one."""

_LEGACY_PREFIX = "helix."
_LEGACY_TURN_KEYS = {
    "helix.turn": "turn",
    "helix.turn_base_step": "base_step",
    "helix.turn_sequence": "sequence",
    "helix.turn_fresh": "fresh",
}


@dataclass(kw_only=True)
class TurnState:
    """Which turn of a continued session the run is in (see ``helix_transport.agent.turns``)."""

    turn: int = 1
    """The turn (1: the one ``Start`` began)."""
    base_step: int = 0
    """Steps taken before the turn began: its ``max_steps`` budget starts there."""
    sequence: int | None = None
    """The sequence of the turn's ``turn_started`` event (``None`` in turn 1)."""
    fresh: bool = False
    """True when the turn began without the earlier conversation."""

    def to_json(self) -> dict[str, Any]:
        """The turn state as stored."""
        return {
            "turn": self.turn,
            "base_step": self.base_step,
            "sequence": self.sequence,
            "fresh": self.fresh,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TurnState:
        """The turn state ``to_json`` stored (absent fields keep their defaults)."""
        sequence = raw.get("sequence")
        return cls(
            turn=int(raw.get("turn", 1)),
            base_step=int(raw.get("base_step", 0)),
            sequence=None if sequence is None else int(sequence),
            fresh=bool(raw.get("fresh", False)),
        )


# --- inputs (helix_transport.agent.inputs) -------------------------------------------

Kind = Literal["approval", "client_result"]


@dataclass(kw_only=True)
class Request:
    """One pending request of this session."""

    request_id: str
    tool_name: str
    kind: Kind
    deadline: float | None = None
    """Epoch seconds past which it expires; ``None``: never."""

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tool_name": self.tool_name,
            "kind": self.kind,
            "deadline": self.deadline,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Request:
        kind: Kind = "client_result" if raw.get("kind") == "client_result" else "approval"
        deadline = raw.get("deadline")
        return cls(
            request_id=str(raw["request_id"]),
            tool_name=str(raw.get("tool_name", "")),
            kind=kind,
            deadline=None if deadline is None else float(deadline),
        )

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(kw_only=True)
class WaitingChild:
    """A child a suspended session waits for: where it is, and how far the session's
    log has followed it (a child whose log went past that has moved on)."""

    child_session_id: str
    address: str
    last_sequence: int

    def to_json(self) -> dict[str, Any]:
        return {
            "child_session_id": self.child_session_id,
            "address": self.address,
            "last_sequence": self.last_sequence,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WaitingChild:
        return cls(
            child_session_id=str(raw["child_session_id"]),
            address=str(raw.get("address", "")),
            last_sequence=int(raw.get("last_sequence", 0)),
        )


OUTCOME_UNKNOWN = (
    "the call's outcome is unknown: the service stopped while it ran, and this tool "
    "never runs twice (approved, or declared once); check its effect before calling it again"
)
"""What the model sees for an at-most-once call (``InputState.started``) that has no
result: it may have run, or not, and will not run again."""


@dataclass(kw_only=True)
class InputState:
    """What a step waiting for input keeps in its checkpoint (``RunState.inputs``)."""

    pending: dict[str, Request] = field(default_factory=dict)
    """This session's own unanswered requests, by request id."""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The tool messages of the step's calls that have finished, by call id: a resumed
    step runs only the others."""
    started: list[str] = field(default_factory=list)
    """Calls handed to a tool that runs at most once (approved calls, and calls of
    ``once`` tools): checkpointed before the tool runs, so a run resumed after a crash
    never runs one twice. A call here without a result uses the result its run logged
    (``tool_end``), else gets an error saying its outcome is unknown. Stored as
    ``approved``, its name when only approved calls were at most once, so checkpoints
    load across versions both ways."""
    output_json: str | None = None
    """The finish tool's valid output, when it ran in a step that then waited (for a
    suspended child): the step ends the run once the rest is in."""
    children: list[WaitingChild] = field(default_factory=list)
    """The suspended children the session waited for when it suspended."""
    suspended_at: float | None = None
    """When it suspended (epoch seconds); ``None`` while it runs."""

    @classmethod
    def of(cls, run: RunState) -> InputState:
        """A working copy of ``run``'s: the run state changes only on ``save``."""
        # Most steps wait for nothing: a new empty state is that copy, without
        # deepcopy's ~50 Python calls (three of them a one-step call).
        return cls() if run.inputs == _NO_INPUTS else copy.deepcopy(run.inputs)

    def save(self, run: RunState) -> None:
        """Write this state into ``run``."""
        run.inputs = InputState() if self == _NO_INPUTS else copy.deepcopy(self)

    def empty(self) -> bool:
        """Nothing to keep (the stored form then has no entry)."""
        return not (
            self.pending
            or self.results
            or self.started
            or self.children
            or self.suspended_at
            or self.output_json is not None
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": [r.to_json() for r in self.pending.values()],
            "results": self.results,
            "approved": self.started,
            "output_json": self.output_json,
            "children": [c.to_json() for c in self.children],
            "suspended_at": self.suspended_at,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InputState:
        return cls(
            pending={r["request_id"]: Request.from_json(r) for r in raw.get("pending", ())},
            results=dict(raw.get("results") or {}),
            started=list(raw.get("approved") or ()),
            output_json=raw.get("output_json"),
            children=[WaitingChild.from_json(c) for c in raw.get("children", ())],
            suspended_at=raw.get("suspended_at"),
        )


_NO_INPUTS = InputState()
"""A step waiting for nothing (compared with, never handed out)."""


# --- companions (helix_transport.delegation.companions) --------------------------------


@dataclass(kw_only=True)
class CompanionChild:
    """A companion child as the parent run keeps it."""

    name: str
    agent_type: str
    session_id: str
    address: str
    tool_call_id: str
    turn: int = 1
    from_sequence: int = 0
    """Where the current turn begins in the child's log."""
    status: str = "running"
    output_json: str = ""
    error: str = ""
    delivered: bool = False
    """The current turn's outcome reached the parent's model."""
    inbox: list[str] = field(default_factory=list)
    """Messages sent while the turn ran, for the next turn (see "Queued messages")."""

    def view(self) -> dict[str, Any]:
        """What the parent's model is shown about the child."""
        shown: dict[str, Any] = {"name": self.name, "agent": self.agent_type, "status": self.status}
        if self.output_json:
            shown["last_output"] = json.loads(self.output_json)
        if self.error:
            shown["error"] = self.error
        if self.inbox:
            shown["queued_messages"] = len(self.inbox)
        return shown

    def outcome(self) -> dict[str, Any]:
        """How the current turn ended, as a tool result shows it."""
        shown: dict[str, Any] = {"status": self.status}
        if self.status == "completed":
            shown["output"] = json.loads(self.output_json)
        elif self.error:
            shown["error"] = self.error
        return shown


@dataclass(kw_only=True)
class CompanionsState:
    """The companions' record of the parent run's children (``RunState.companions``)."""

    counters: dict[str, int] = field(default_factory=dict)
    """The last ``n`` of each agent type's ``{agent_type}-{n}`` names."""
    children: dict[str, CompanionChild | None] = field(default_factory=dict)
    """By name; ``None``: a name reserved by a spawn still starting its child."""

    def empty(self) -> bool:
        return not (self.counters or self.children)

    def to_json(self) -> dict[str, Any]:
        return {
            "counters": dict(self.counters),
            "children": {
                name: None if c is None else dataclasses.asdict(c)
                for name, c in self.children.items()
            },
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CompanionsState:
        children = raw.get("children") or {}
        return cls(
            counters={str(k): int(v) for k, v in (raw.get("counters") or {}).items()},
            children={
                str(name): None if entry is None else CompanionChild(**entry)
                for name, entry in children.items()
            },
        )


# --- dispatch (helix_transport.delegation.dispatch) ------------------------------------


@dataclass(kw_only=True)
class DispatchTask:
    """One ``run_subagent`` task."""

    task_id: str
    agent_type: str
    session_id: str
    address: str
    status: str = "running"
    """A session status's value, or ``timed_out`` (the dispatcher's own word)."""
    output_json: str = ""
    error: str = ""
    turn: int = 1
    """The child's turn the task is: 1 starts its conversation, a later one continues
    it (``conversation_key``)."""
    from_sequence: int = 0
    """Where the turn begins in the child's log (0 for turn 1)."""
    conversation_key: str = ""
    """What a later task passes to continue the conversation."""
    virtual: bool = False
    """A one-shot child of the parent's own type (the task named no agent)."""


_TASK_FIELDS = frozenset(f.name for f in dataclasses.fields(DispatchTask))
_LATER_TASK_FIELDS = {"turn": 1, "from_sequence": 0, "conversation_key": "", "virtual": False}
"""Task fields added after the first typed run state, with their defaults."""


def _task_json(task: DispatchTask) -> dict[str, Any]:
    # A later field at its default is left out: a version before it (a rollback) reads
    # the task as it wrote it. A conversation's later turn it cannot read, nor run.
    stored = dataclasses.asdict(task)
    return {
        k: v for k, v in stored.items() if k not in _LATER_TASK_FIELDS or _LATER_TASK_FIELDS[k] != v
    }


@dataclass(kw_only=True)
class DispatchBatch:
    """The tasks of one ``run_subagent`` call, delivered together."""

    tool_call_id: str
    tasks: list[DispatchTask] = field(default_factory=list)
    delivered: bool = False
    """Their results are in the conversation (durable with it)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tool_call_id": self.tool_call_id,
            "tasks": [_task_json(t) for t in self.tasks],
            "delivered": self.delivered,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DispatchBatch:
        return cls(
            tool_call_id=str(raw["tool_call_id"]),
            tasks=[
                DispatchTask(**{k: v for k, v in t.items() if k in _TASK_FIELDS})
                for t in raw.get("tasks", ())
            ],
            delivered=bool(raw.get("delivered", False)),
        )


@dataclass(kw_only=True)
class DispatchState:
    """Dispatch's record of the run's batches and its deadline (``RunState.dispatch``)."""

    batches: list[DispatchBatch] = field(default_factory=list)
    turn: int = 1
    """The turn ``started_at`` belongs to (the deadline is per turn)."""
    started_at: float | None = None
    """When the turn's first step ran (epoch seconds): the deadline counts from there."""
    final_pass_step: int | None = None
    """The step of the one pass after the deadline, once it began."""

    def empty(self) -> bool:
        return self == DispatchState()

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": [b.to_json() for b in self.batches],
            "turn": self.turn,
            "started_at": self.started_at,
            "final_pass_step": self.final_pass_step,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DispatchState:
        started_at, final = raw.get("started_at"), raw.get("final_pass_step")
        return cls(
            batches=[DispatchBatch.from_json(b) for b in raw.get("batches", ())],
            turn=int(raw.get("turn", 1)),
            started_at=None if started_at is None else float(started_at),
            final_pass_step=None if final is None else int(final),
        )


# --- delegation spans (helix_transport.delegation.spans) -------------------------------


@dataclass(kw_only=True)
class OpenSpan:
    """A delegation span left open by a child that outlives its tool call."""

    tool_call_id: str
    agent_type: str
    turn: int


@dataclass(kw_only=True)
class DelegationSpans:
    """The open delegation spans, by child session id (``RunState.delegations``)."""

    open: dict[str, OpenSpan] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.open

    def to_json(self) -> dict[str, Any]:
        return {child: dataclasses.asdict(span) for child, span in self.open.items()}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DelegationSpans:
        return cls(
            open={
                str(child): OpenSpan(
                    tool_call_id=str(s["tool_call_id"]),
                    agent_type=str(s["agent_type"]),
                    turn=int(s["turn"]),
                )
                for child, s in raw.items()
            }
        )


# --- the run state ----------------------------------------------------------------------

_INPUTS, _COMPANIONS, _DISPATCH, _DELEGATIONS = "inputs", "companions", "dispatch", "delegations"
"""The stored names of the extensions (``RunState.to_json``'s ``extensions`` entries)."""


@dataclass(kw_only=True)
class RunState:
    """The library's state of one run, checkpointed beside ``ToolContext.state``."""

    turns: TurnState = field(default_factory=TurnState)
    inputs: InputState = field(default_factory=InputState)
    """What a step waiting for input keeps (``agent.inputs``)."""
    companions: CompanionsState = field(default_factory=CompanionsState)
    """The companions' children (``delegation.companions``)."""
    dispatch: DispatchState = field(default_factory=DispatchState)
    """The ``run_subagent`` batches (``delegation.dispatch``)."""
    delegations: DelegationSpans = field(default_factory=DelegationSpans)
    """Delegation spans open across steps (``delegation.spans``)."""
    unknown_extensions: dict[str, Any] = field(default_factory=dict)
    """Stored extension entries this version does not know, kept as they were."""

    def to_json(self) -> dict[str, Any]:
        """The run state as stored under ``RUN_STATE_KEY``: the form this module had
        when the extensions were a dict by name (an extension with nothing to keep has
        no entry), so checkpoints load across versions either way."""
        extensions = dict(self.unknown_extensions)
        parts: list[tuple[str, InputState | CompanionsState | DispatchState | DelegationSpans]]
        parts = [
            (_INPUTS, self.inputs),
            (_COMPANIONS, self.companions),
            (_DISPATCH, self.dispatch),
            (_DELEGATIONS, self.delegations),
        ]
        for name, part in parts:
            if not part.empty():
                extensions[name] = part.to_json()
        return {"turns": self.turns.to_json(), "extensions": extensions}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunState:
        """The run state ``to_json`` stored."""
        return _run_state(TurnState.from_json(raw.get("turns") or {}), raw.get("extensions") or {})


def _run_state(turns: TurnState, extensions: Mapping[str, Any]) -> RunState:
    """The run state of ``turns`` and the stored extension entries, by name."""
    known = {_INPUTS, _COMPANIONS, _DISPATCH, _DELEGATIONS}
    return RunState(
        turns=turns,
        inputs=InputState.from_json(extensions.get(_INPUTS) or {}),
        companions=CompanionsState.from_json(extensions.get(_COMPANIONS) or {}),
        dispatch=DispatchState.from_json(extensions.get(_DISPATCH) or {}),
        delegations=DelegationSpans.from_json(extensions.get(_DELEGATIONS) or {}),
        unknown_extensions={k: v for k, v in extensions.items() if k not in known},
    )


def split_state(stored: Mapping[str, Any]) -> tuple[dict[str, Any], RunState]:
    """A checkpoint's ``state`` as the user's state and the run state.

    Without ``RUN_STATE_KEY`` (a checkpoint of an older version, or none yet), every
    ``helix.*`` key was the library's: the turn keys become ``RunState.turns`` and
    any other ``helix.<name>`` the extension ``<name>``.
    """
    user = dict(stored)
    raw = user.pop(RUN_STATE_KEY, None)
    if isinstance(raw, Mapping):
        return user, RunState.from_json(raw)
    legacy = {k: user.pop(k) for k in list(user) if k.startswith(_LEGACY_PREFIX)}
    turns = {_LEGACY_TURN_KEYS[k]: v for k, v in legacy.items() if k in _LEGACY_TURN_KEYS}
    extensions = {
        k.removeprefix(_LEGACY_PREFIX): v for k, v in legacy.items() if k not in _LEGACY_TURN_KEYS
    }
    return user, _run_state(TurnState.from_json(turns), extensions)


def joined_state(user: Mapping[str, Any], run: RunState) -> dict[str, Any]:
    """The checkpoint's ``state``: the user's keys and the run state under its key
    (a user key of that name is the library's and is replaced)."""
    return {**user, RUN_STATE_KEY: run.to_json()}
