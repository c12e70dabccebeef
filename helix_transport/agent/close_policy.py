"""What a parent's end does to its children: the close policy, declared per child kind.

In the spirit of Temporal's ``ParentClosePolicy``. Each kind of child (a ``run_subagent``
task, a companion, a remote agent tool) declares, per agent type, what happens to a
child still running when its parent's turn ends (completes, fails, is interrupted):

- ``TERMINATE`` (the default): the child is interrupted through the parent's outbox, so
  no orphan runs on;
- ``WAIT`` (``run_subagent`` tasks only): the parent's completion waits for the batch; a
  ``__finish__`` while such tasks are out is held until they end, and their results go
  to the parent's model for one more pass (a parent that fails or is interrupted cannot
  wait: its ``WAIT`` children are terminated);
- ``ABANDON``: the child runs on, and an ``Interrupt`` of the parent does not reach it
  either. Only an abort (``Interrupt(abort=True)``) overrides every policy: it ends the
  whole subtree.

The parent's log records, per child, what was done (``close_policy_applied``).
``helix_transport.agent._closing`` carries the policy out, durably, with the parent's
terminal write.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


class ClosePolicy(enum.Enum):
    """What a parent's end does to a child of a kind (see the module docstring)."""

    TERMINATE = "terminate"
    """Interrupt the child through the outbox when the parent's turn ends."""
    WAIT = "wait"
    """Hold the parent's completion until the child ends (``run_subagent`` tasks)."""
    ABANDON = "abandon"
    """Leave the child running."""

    def to_proto(self) -> pb.ClosePolicy.ValueType:
        """The protobuf twin."""
        return _TO_PROTO[self]


_TO_PROTO = {
    ClosePolicy.TERMINATE: pb.CLOSE_POLICY_TERMINATE,
    ClosePolicy.WAIT: pb.CLOSE_POLICY_WAIT,
    ClosePolicy.ABANDON: pb.CLOSE_POLICY_ABANDON,
}


class ChildKind(enum.Enum):
    """A kind of child, by the word its session id carries (``derived_session_id``)."""

    REMOTE = "remote"
    """A remote agent as a tool."""
    COMPANION = "agent"
    """A companion (persistent child)."""
    TASK = "task"
    """A ``run_subagent`` task."""


_WAITS = frozenset({ChildKind.TASK})
"""Kinds whose parent can hold its completion for them: a remote tool's call already
waits for its child, and a companion is long-lived (its turns are pulled with
``wait_for_result``)."""


@dataclass(frozen=True, kw_only=True)
class ChildDeclaration:
    """The close policy of one child kind and agent type, as a parent declares it."""

    kind: ChildKind
    agent_type: str
    close_policy: ClosePolicy = ClosePolicy.TERMINATE

    def __post_init__(self) -> None:
        if not isinstance(self.close_policy, ClosePolicy):
            raise UsageError(
                f"{self.agent_type}: close_policy must be a ClosePolicy, not {self.close_policy!r}"
            )
        if self.close_policy is ClosePolicy.WAIT and self.kind not in _WAITS:
            raise UsageError(
                f"{self.agent_type}: close_policy WAIT is for run_subagent tasks only (a "
                f"{self.kind.name.lower()} child is terminated or abandoned)"
            )


def declared_policies(
    declarations: list[ChildDeclaration],
) -> dict[tuple[ChildKind, str], ClosePolicy]:
    """The policies by (kind, agent type).

    Raises:
        UsageError: one kind and type declared with two different policies.
    """
    policies: dict[tuple[ChildKind, str], ClosePolicy] = {}
    for d in declarations:
        key = (d.kind, d.agent_type)
        if policies.setdefault(key, d.close_policy) is not d.close_policy:
            raise UsageError(
                f"{d.kind.name.lower()} children of type {d.agent_type!r} are declared with "
                f"two close policies ({policies[key].value} and {d.close_policy.value})"
            )
    return policies


_DIGESTED = re.compile(r"-([a-z]+)-[0-9a-f]{64}$")


def child_kind(parent_session_id: str, child_session_id: str) -> ChildKind | None:
    """The kind of a child, read from its id (``derived_session_id``'s two forms:
    ``{parent}-{kind}-...`` and ``{prefix}-{kind}-{digest}``); ``None`` when it is
    neither (a child this library did not name)."""
    for kind in ChildKind:
        if child_session_id.startswith(f"{parent_session_id}-{kind.value}-"):
            return kind
    found = _DIGESTED.search(child_session_id) or re.fullmatch(
        r"([a-z]+)-[0-9a-f]{64}", child_session_id
    )
    if found is None:
        return None
    try:
        return ChildKind(found.group(1))
    except ValueError:
        return None


def applied(
    *,
    child_session_id: str,
    agent_type: str,
    policy: ClosePolicy,
    action: pb.CloseAction.ValueType,
    reason: str,
    undelivered: int = 0,
) -> pb.StreamEvent:
    """The parent's log entry for one child its close policy reached."""
    return pb.StreamEvent(
        close_policy_applied=pb.ClosePolicyApplied(
            child_session_id=child_session_id,
            child_agent_type=agent_type,
            policy=policy.to_proto(),
            action=action,
            reason=reason,
            undelivered_messages=undelivered,
        )
    )
