"""The companions' roster: the child types a parent may keep, its tools' arguments,
and the children it keeps (``RunState.companions``, a child at a time)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from helix_transport.agent.close_policy import ChildDeclaration, ChildKind, ClosePolicy
from helix_transport.agent.state import CompanionChild, CompanionsState
from helix_transport.agent.tools import (
    ToolContext,
    derived_session_id,
)

PREFIX = "companion__"
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
    close_policy: ClosePolicy = ClosePolicy.TERMINATE
    """What the parent's end does to a child of this type still running: ``TERMINATE``
    (interrupted, its queued messages reported not delivered) or ``ABANDON`` (runs on);
    ``WAIT`` is refused (``helix_transport.agent.close_policy``)."""

    def __post_init__(self) -> None:
        self.declaration()  # a wrong policy fails at definition

    def declaration(self) -> ChildDeclaration:
        """The type's close policy, as the parent ``Agent`` declares it."""
        return ChildDeclaration(
            kind=ChildKind.COMPANION, agent_type=self.agent_type, close_policy=self.close_policy
        )


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


Child = CompanionChild
"""A child as the parent run keeps it (``RunState.companions``)."""


class Children:
    """The run's ``RunState.companions``, a child at a time: ``get`` gives a copy, and
    what a tool changes in it counts once ``put`` back."""

    def __init__(self, state: CompanionsState) -> None:
        self.state = state

    def get(self, name: str) -> Child | None:
        entry = self.state.children.get(name)
        return _copy(entry) if entry is not None else None

    def put(self, child: Child) -> None:
        self.state.children[child.name] = _copy(child)

    def discard(self, name: str) -> None:
        """Forget ``name`` (a name reserved by a spawn that did not start its child)."""
        self.state.children.pop(name, None)

    def all(self) -> list[Child]:
        # A None entry is a name reserved by a spawn still starting its child.
        return [_copy(entry) for entry in self.state.children.values() if entry is not None]

    def auto_name(self, agent_type: str) -> str:
        """``{agent_type}-{n}``: the next free n. Synchronous, so never shared."""
        counters = self.state.counters
        while True:
            counters[agent_type] = counters.get(agent_type, 0) + 1
            name = f"{agent_type}-{counters[agent_type]}"
            if name not in self.state.children:
                # Reserve it at once: a concurrent spawn must not pick it too.
                self.state.children[name] = None
                return name


def _copy(child: Child) -> Child:
    return dataclasses.replace(child, inbox=list(child.inbox))


def lock(ctx: ToolContext, name: str) -> asyncio.Lock:
    """The child's lock in this run: tools on one child run one at a time, in the order
    the model called them, each on the child as the one before left it (concurrent
    calls used to write back stale copies: an outcome marked delivered was unmarked,
    and pushed twice)."""
    return ctx.run.cache.companion_locks.setdefault(name, asyncio.Lock())
