"""The library's own state of a run, kept apart from the state its tools see.

A run has two states, both saved with every checkpoint: ``ToolContext.state``, the
user's tools' free-form dict, and ``RunState``, the library's bookkeeping (which turn
the run is in, the companions', dispatch's and delegation spans' records). They travel
in one JSON object, the checkpoint's ``state``: the run state under the one reserved key
``RUN_STATE_KEY``, which ``split_state`` takes out before tools see the dict and
``joined_state`` puts back when saving. One key in an existing field rather than a new
field of ``Checkpoint``: every backend already stores that JSON, so no schema changes.

A checkpoint written before this module (the library's keys as ``"helix.*"`` entries
among the user's) is migrated when loaded: those keys move into the run state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(kw_only=True)
class RunState:
    """The library's state of one run, checkpointed beside ``ToolContext.state``."""

    turns: TurnState = field(default_factory=TurnState)
    extensions: dict[str, Any] = field(default_factory=dict)
    """The JSON state of the library's delegation extensions, by extension
    (``companions``, ``dispatch``, ``delegations``): each owns its entry."""

    def to_json(self) -> dict[str, Any]:
        """The run state as stored under ``RUN_STATE_KEY``."""
        return {"turns": self.turns.to_json(), "extensions": self.extensions}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunState:
        """The run state ``to_json`` stored."""
        return cls(
            turns=TurnState.from_json(raw.get("turns") or {}),
            extensions=dict(raw.get("extensions") or {}),
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
    return user, RunState(turns=TurnState.from_json(turns), extensions=extensions)


def joined_state(user: Mapping[str, Any], run: RunState) -> dict[str, Any]:
    """The checkpoint's ``state``: the user's keys and the run state under its key
    (a user key of that name is the library's and is replaced)."""
    return {**user, RUN_STATE_KEY: run.to_json()}
