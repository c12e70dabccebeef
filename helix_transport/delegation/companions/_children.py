"""The state of a parent's companions: declared types, tool arguments, and the
children recorded in the parent run's state."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from helix_transport.agent.tools import (
    ToolContext,
    derived_session_id,
)

PREFIX = "companion__"
STATE_KEY = "companions"
"""The companions' entry of the parent run's ``RunState.extensions``: its children."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
"""Names become part of session ids, so they use the session-id alphabet."""
MAX_INBOX = 16
"""Messages ``send_message`` may queue for a running child's next turn."""
TERMINATE_WAIT_S = 5.0
"""How long ``terminate_child`` waits to see how an interrupted child ended."""

Mode = Literal["blocking", "non-blocking"]


@dataclass(frozen=True, kw_only=True)
class PersistentChild:
    """A child agent type the parent may keep, by registry name."""

    agent_type: str
    """The child's agent type; its service is found in the mesh registry."""
    mode: Mode = "blocking"
    """``blocking``: a spawn waits for the child's result. ``non-blocking``: it returns
    at once and the result arrives as a notification at the parent's next step."""
    input_field: str | None = "message"
    """The first message becomes the child's input ``{input_field: message}``; with
    ``None`` the message must be the child's input JSON itself."""
    address: str | None = None
    """The child service's address; ``None`` looks it up at call time."""
    description: str = ""
    """What the type does, for the parent's model."""


def child_session_id(parent_session_id: str, name: str, scope: str) -> str:
    """The stable session id of the persistent child ``name``.

    ``scope`` is the parent's ``ToolContext.child_scope`` (its agent type and owner).
    """
    return derived_session_id(parent_session_id, "agent", name, scope)


# --- arguments ------------------------------------------------------------------------


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class _Named(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)


class SpawnArgs(BaseModel):
    agent: str = Field(description="The persistent agent type to spawn.")
    message: str = Field(description="The task or message for the child.")
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=NAME_PATTERN,
        description="A name to re-consult the child by; omit to get `{agent}-{n}`.",
    )

    _message = field_validator("message")(_not_blank)


class SendArgs(_Named):
    message: str

    _message = field_validator("message")(_not_blank)


class NameArgs(_Named):
    pass


class WaitArgs(_Named):
    timeout_s: float | None = Field(
        default=None, gt=0, description="Give up waiting after this many seconds."
    )


class NoArgs(BaseModel):
    pass


# --- the children, as the parent run keeps them ----------------------------------------


@dataclass(kw_only=True)
class Child:
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


class Children:
    """The ``STATE_KEY`` entry of a run's ``RunState.extensions``, with typed access."""

    def __init__(self, extensions: dict[str, Any]) -> None:
        self.raw = extensions.setdefault(STATE_KEY, {"counters": {}, "children": {}})

    def get(self, name: str) -> Child | None:
        entry = self.raw["children"].get(name)
        return Child(**entry) if entry is not None else None

    def put(self, child: Child) -> None:
        self.raw["children"][child.name] = dataclasses.asdict(child)

    def all(self) -> list[Child]:
        # A None entry is a name reserved by a spawn still starting its child.
        return [Child(**entry) for entry in self.raw["children"].values() if entry is not None]

    def auto_name(self, agent_type: str) -> str:
        """``{agent_type}-{n}``: the next free n. Synchronous, so never shared."""
        counters = self.raw["counters"]
        while True:
            counters[agent_type] = counters.get(agent_type, 0) + 1
            name = f"{agent_type}-{counters[agent_type]}"
            if name not in self.raw["children"]:
                # Reserve it at once: a concurrent spawn must not pick it too.
                self.raw["children"][name] = None
                return name


_LOCKS_KEY = "companions.locks"


def lock(ctx: ToolContext, name: str) -> asyncio.Lock:
    """The child's lock in this run: tools on one child run one at a time, in the order
    the model called them, each on the child as the one before left it (concurrent
    calls used to write back stale copies: an outcome marked delivered was unmarked,
    and pushed twice)."""
    locks: dict[str, asyncio.Lock] = ctx.run.cache.setdefault(_LOCKS_KEY, {})
    return locks.setdefault(name, asyncio.Lock())
