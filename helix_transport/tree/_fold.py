"""The fold of one root session's log into its tree (``SessionTree``), node by node."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from helix_transport._events import EventKind, SessionStatus, event_kind
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.tree._totals import reported_usage


@dataclass(frozen=True, kw_only=True)
class TreeUsage:
    """Token counts, as ``TokenUsage`` in the contract."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: TreeUsage) -> TreeUsage:
        return TreeUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )

    @classmethod
    def from_proto(cls, usage: pb.TokenUsage) -> TreeUsage:
        """The counts of a ``TokenUsage`` (an unset one is all zero)."""
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )

    def to_json(self) -> dict[str, int]:
        """``{"prompt_tokens": ..., "completion_tokens": ..., "total_tokens": ...}``."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True, kw_only=True)
class PendingRequest:
    """A request for input a session of the tree waits for (its ``InputRequired``)."""

    session_id: str
    """The session that asked (the last entry of ``path``)."""
    request_id: str
    """The id to answer with: the tool call's id."""
    tool_name: str
    arguments_json: str
    """The call's arguments, as a JSON object."""
    kind: str
    """``approval`` (approve or deny the call) or ``client_result`` (run the tool, send
    its result)."""
    path: tuple[str, ...]
    """Session ids from the root down to ``session_id``: ``SubmitInputRequest.path``."""
    deadline: datetime | None = None
    """When it expires into an error result; ``None``: never."""

    def to_json(self) -> dict[str, object]:
        """The request as JSON values (arguments parsed, deadline in RFC 3339)."""
        try:
            arguments: object = json.loads(self.arguments_json)
        except ValueError:
            arguments = self.arguments_json  # a foreign service's: shown as it came
        return {
            "session_id": self.session_id,
            "request_id": self.request_id,
            "tool_name": self.tool_name,
            "arguments": arguments,
            "kind": self.kind,
            "path": list(self.path),
            "deadline": rfc3339(self.deadline),
        }

    @classmethod
    def from_proto(
        cls, session_id: str, asked: pb.InputRequired, *, path: tuple[str, ...] = ()
    ) -> PendingRequest:
        """The request of an ``InputRequired`` logged by ``session_id``; ``path`` is the
        fold's own when the event carries none (a service that did not fill it)."""
        deadline = None
        if asked.HasField("deadline"):
            deadline = asked.deadline.ToDatetime(tzinfo=UTC)
        return cls(
            session_id=session_id,
            request_id=asked.request_id,
            tool_name=asked.tool_name,
            arguments_json=asked.arguments_json,
            kind=_KIND_NAMES.get(asked.kind, "unspecified"),
            path=tuple(asked.path) or path,
            deadline=deadline,
        )


_KIND_NAMES = {
    pb.INPUT_KIND_APPROVAL: "approval",
    pb.INPUT_KIND_CLIENT_RESULT: "client_result",
}


@dataclass(kw_only=True)
class TreeNode:
    """One session of the tree, as far as the events folded so far tell."""

    session_id: str
    agent_type: str
    parent_session_id: str | None
    """``None`` at the root."""
    tool_call_id: str | None
    """The parent's tool call that started it (``None`` at the root)."""
    address: str | None
    """The child's service address, when its parent logged one."""
    status: SessionStatus = SessionStatus.RUNNING
    """``RUNNING`` until its terminal event (or, for a child whose own events were not
    forwarded, its parent's ``subagent_end``); ``SUSPENDED`` from its ``suspended``
    event to its next one (or to an ancestor's interrupt or abort, whose status it
    then takes)."""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    step_count: int = 0
    """Steps it has completed, as ``GetStatusResponse.step_count`` counts them (steps
    go on numbering across turns): a step counts once the next one starts or the
    session completes in it. A session suspended, failed or stopped inside step N has
    completed N - 1 (an interrupt that lands between steps reads, from the log, as
    inside the last one)."""
    usage: TreeUsage = field(default_factory=TreeUsage)
    """Its own usage, as its latest terminal event reports it (zero before one)."""
    total_usage: TreeUsage = field(default_factory=TreeUsage)
    """Its own plus its subtree's: from its terminal event once it has ended, summed
    from its children while it runs."""
    output_json: str | None = None
    error: str | None = None
    limit_exceeded: str | None = None
    """``deadline_exceeded`` or ``budget_exceeded`` when a limit ended it."""
    events: list[pb.StreamEvent] = field(default_factory=list)
    """Its own events, unwrapped from ``ChildEvent``, in order (a child's are in the child)."""
    children: list[TreeNode] = field(default_factory=list)
    turn: int = 1
    """Its current turn (2 and up once continued)."""
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    """Its own requests for input still unanswered, by request id, in the order asked."""
    _sequences: set[int] = field(default_factory=set, repr=False)
    _reported_total: TreeUsage | None = field(default=None, repr=False)
    _ended_by_own_event: bool = field(default=False, repr=False)
    _stopped_with_ancestor: bool = field(default=False, repr=False)

    def duration(self, *, now: datetime | None = None) -> timedelta | None:
        """How long it ran: start to end; while running, start to ``now`` when given."""
        if self.started_at is None:
            return None
        if self.ended_at is not None:
            return self.ended_at - self.started_at
        return None if now is None else now - self.started_at

    def to_json(self) -> dict[str, object]:
        """The node and its subtree as JSON values (times in RFC 3339, output parsed)."""
        output: object = None
        if self.output_json:
            try:
                output = json.loads(self.output_json)
            except ValueError:
                output = self.output_json  # a foreign service's: shown as it came
        return {
            "session_id": self.session_id,
            "agent_type": self.agent_type,
            "status": self.status.value,
            "tool_call_id": self.tool_call_id,
            "address": self.address,
            "started_at": rfc3339(self.started_at),
            "ended_at": rfc3339(self.ended_at),
            "step_count": self.step_count,
            "usage": {"own": self.usage.to_json(), "total": self.total_usage.to_json()},
            "output": output,
            "error": self.error,
            "pending_requests": [request.to_json() for request in self.pending.values()],
            "children": [child.to_json() for child in self.children],
        }

    def walk(self) -> Iterable[TreeNode]:
        """This node, then its subtree, depth first in the order children appeared."""
        yield self
        for child in self.children:
            yield from child.walk()


class SessionTree:
    """The fold of one root session's stream, live: ``add`` each event as it arrives."""

    def __init__(self) -> None:
        self.root: TreeNode | None = None
        self._nodes: dict[str, TreeNode] = {}

    def node(self, session_id: str) -> TreeNode | None:
        """The node of ``session_id``, if an event named it."""
        return self._nodes.get(session_id)

    def pending_requests(self) -> list[PendingRequest]:
        """Every request for input waiting in the tree: node by node, depth first, each
        node's in the order asked."""
        if self.root is None:
            return []
        return [request for node in self.root.walk() for request in node.pending.values()]

    def add(self, event: pb.StreamEvent) -> TreeNode:
        """Fold one event of the root's stream; returns the node it touched (for a
        ``ChildEvent``, the innermost child's).

        Idempotent per (``session_id``, ``sequence``) at every depth: an event seen
        before (a replay, a reconnect's overlap) changes nothing.

        Raises:
            ValueError: for an event of another session than the root's.
        """
        if self.root is None:
            self.root = self._nodes[event.session_id] = TreeNode(
                session_id=event.session_id,
                agent_type=event.agent_type,
                parent_session_id=None,
                tool_call_id=None,
                address=None,
            )
        elif event.session_id != self.root.session_id:
            raise ValueError(
                f"event of session {event.session_id!r} in the stream of {self.root.session_id!r}"
            )
        touched = self._fold(self.root, event)
        self._total_upwards(touched)
        return touched

    def _fold(self, node: TreeNode, event: pb.StreamEvent) -> TreeNode:
        if event.sequence:
            if event.sequence in node._sequences:
                return node
            node._sequences.add(event.sequence)
        row = event_kind(event)
        kind = row.name
        if node.status is SessionStatus.SUSPENDED or node._stopped_with_ancestor:
            # Only a running session writes its log (a forwarded child event included).
            node.status = SessionStatus.RUNNING
            node._stopped_with_ancestor = False
        if kind == "child_event":
            wrapped = event.child_event
            child = self._child(
                node, wrapped.event.session_id, wrapped.event.agent_type, wrapped.tool_call_id
            )
            return self._fold(child, wrapped.event)
        node.events.append(event)
        at = _time(event)
        if node.started_at is None:
            node.started_at = at
        if kind == "run_started":
            node.started_at = at or node.started_at
            parent = event.run_started.parent_session_id
            if parent and node.parent_session_id is None and node is not self.root:
                node.parent_session_id = parent
        elif kind == "step_started":
            node.step_count = max(node.step_count, event.step - 1)
        elif kind == "turn_started":
            node.turn = event.turn_started.turn
            _reopen(node)
        elif row.terminal:
            if kind == "completed" or event.failed.failure_reason == "max_steps":
                # It completed in its last step, or failed between steps (out of them).
                node.step_count = max(node.step_count, event.step)
            _end_by_own_event(node, event, row, at)
            _stop_below(node)
        elif kind == "input_required":
            asked = PendingRequest.from_proto(
                node.session_id, event.input_required, path=self._path(node)
            )
            node.pending[asked.request_id] = asked
        elif kind == "input_answered":
            node.pending.pop(event.input_answered.request_id, None)
        elif kind == "suspended":
            node.status = SessionStatus.SUSPENDED
        elif kind == "subagent_start":
            start = event.subagent_start
            child = self._child(
                node, start.child_session_id, start.child_agent_type, start.tool_call_id
            )
            child.address = start.address or child.address
            if child.status.is_terminal:  # a companion's next turn
                _reopen(child)
            if child.started_at is None:
                child.started_at = at
        elif kind == "subagent_end":
            self._ended_by_parent(node, event.subagent_end, at)
        return node

    def _child(
        self, parent: TreeNode, session_id: str, agent_type: str, tool_call_id: str
    ) -> TreeNode:
        child = self._nodes.get(session_id)
        if child is None:
            child = self._nodes[session_id] = TreeNode(
                session_id=session_id,
                agent_type=agent_type,
                parent_session_id=parent.session_id,
                tool_call_id=tool_call_id or None,
                address=None,
            )
            parent.children.append(child)
        elif not child.agent_type:
            child.agent_type = agent_type
        return child

    def _ended_by_parent(self, parent: TreeNode, end: pb.SubagentEnd, at: datetime | None) -> None:
        """The parent's word on a child's end; the child's own terminal event, when it
        was forwarded, says more (its usage) and is not overridden."""
        child = self._child(parent, end.child_session_id, end.child_agent_type, end.tool_call_id)
        if child._ended_by_own_event:
            return
        try:
            child.status = SessionStatus.from_proto(end.status)
        except ValueError:
            child.status = SessionStatus.FAILED  # a terminal status nobody named
        child.output_json = end.output_json or None
        child.error = end.error or None
        child.ended_at = at
        if child.status.is_terminal:
            child.pending.clear()

    def _path(self, node: TreeNode) -> tuple[str, ...]:
        """Session ids from the root down to ``node``."""
        path = [node.session_id]
        parent = node.parent_session_id
        while parent is not None and (above := self._nodes.get(parent)) is not None:
            path.append(above.session_id)
            parent = above.parent_session_id
        return tuple(reversed(path))

    def _total_upwards(self, node: TreeNode | None) -> None:
        """Recompute ``total_usage`` from ``node`` up to the root."""
        while node is not None:
            if node._reported_total is not None:
                node.total_usage = node._reported_total
            else:
                total = node.usage
                for child in node.children:
                    total = total + child.total_usage
                node.total_usage = total
            parent = node.parent_session_id
            node = self._nodes.get(parent) if parent is not None else None


def fold_events(events: Iterable[pb.StreamEvent]) -> SessionTree:
    """The tree of a root session's events (see ``SessionTree.add``)."""
    tree = SessionTree()
    for event in events:
        tree.add(event)
    return tree


def _end_by_own_event(
    node: TreeNode, event: pb.StreamEvent, kind: EventKind, at: datetime | None
) -> None:
    node.ended_at = at
    node._ended_by_own_event = True
    node.pending.clear()  # an ended session answers nothing (its requests are cancelled)
    node.status = kind.status or SessionStatus.FAILED  # every terminal row names one
    node.limit_exceeded = None
    if kind.name == "completed":
        node.output_json, node.error = event.completed.output_json, None
        node.limit_exceeded = event.completed.limit_exceeded or None
    elif kind.name == "failed":
        node.error = event.failed.error
    else:  # interrupted, terminated: why, if anyone said
        node.error = getattr(event, kind.name).reason or None
        if kind.name == "interrupted":
            node.limit_exceeded = event.interrupted.limit_exceeded or None
    own, total = reported_usage(event)
    node.usage = TreeUsage.from_proto(own)
    # A service that reports no subtree: what its forwarded children say.
    node._reported_total = None if total is None else TreeUsage.from_proto(total)


def _stop_below(node: TreeNode) -> None:
    """What an ended session means for its subtree: no request below it can be answered
    through it any more, and a suspended descendant (whose own end an ended parent no
    longer forwards) stopped with it when it was interrupted or aborted: interrupts and
    aborts cascade down the tree."""
    for below in node.walk():
        if below is node:
            continue
        below.pending.clear()
        if below.status is SessionStatus.SUSPENDED and node.status in (
            SessionStatus.INTERRUPTED,
            SessionStatus.TERMINATED,
        ):
            below.status = node.status
            below._stopped_with_ancestor = True


def _reopen(node: TreeNode) -> None:
    """A new turn: running again until that turn's terminal event."""
    node.status = SessionStatus.RUNNING
    node.ended_at = None
    node.output_json = None
    node.error = None
    node.pending.clear()
    node._ended_by_own_event = False
    node._reported_total = None


def _time(event: pb.StreamEvent) -> datetime | None:
    if not event.HasField("time"):
        return None
    return datetime.fromtimestamp(event.time.seconds + event.time.nanos / 1e9, tz=UTC)


def rfc3339(moment: datetime | None) -> str | None:
    """``moment`` as every ``--json`` and the inspector print a time: RFC 3339 in UTC
    with microseconds, always six digits (``2026-11-26T09:00:00.120000Z``); ``None``
    stays ``None``. A naive ``moment`` is taken as UTC."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
