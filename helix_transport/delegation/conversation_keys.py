"""``run_subagent``'s conversation keys: what a later call passes to continue a child.

A key names one child session of one parent, and who the parent is: its session, its
agent type, its owner (tenant and principal). It is derived from the child's ref, the
parent's durable record of the child, so it is the same after either side restarts, and
it is checked against that ref, not trusted: a key is only a pointer. A key that names
another parent, owner or agent type is refused with the reason; one that names this
parent but a child it has no ref of (a forged key) is refused too, without saying more
than that. The parent's model sees keys as opaque strings (``subagent-…``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from helix_transport._events import SessionStatus
from helix_transport.agent.tools import ToolContext, ToolError
from helix_transport.store import SubSessionRef

PREFIX = "subagent-"
_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ConversationKey:
    """What a key says. Only ``child_session_id`` selects; the rest says whose it is."""

    parent_session_id: str
    child_session_id: str
    parent_agent_type: str
    tenant: str
    principal: str

    def encode(self) -> str:
        """The key as the model sees it."""
        fields = [
            _VERSION,
            self.parent_session_id,
            self.child_session_id,
            self.parent_agent_type,
            self.tenant,
            self.principal,
        ]
        raw = json.dumps(fields, separators=(",", ":")).encode()
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, key: str) -> ConversationKey | None:
        """The key's fields; ``None`` for anything that is not a key."""
        if not key.startswith(PREFIX):
            return None
        body = key[len(PREFIX) :]
        try:
            fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (binascii.Error, ValueError):
            return None
        if (
            not isinstance(fields, list)
            or len(fields) != 6
            or fields[0] != _VERSION
            or not all(isinstance(f, str) for f in fields[1:])
        ):
            return None
        return cls(
            parent_session_id=fields[1],
            child_session_id=fields[2],
            parent_agent_type=fields[3],
            tenant=fields[4],
            principal=fields[5],
        )


def key_of(ctx: ToolContext, child_session_id: str) -> str:
    """The key of ``child_session_id``, a child of ``ctx``'s session."""
    return ConversationKey(
        parent_session_id=ctx.session_id,
        child_session_id=child_session_id,
        parent_agent_type=ctx.agent_type,
        tenant=ctx.tenant,
        principal=ctx.principal or "anonymous",
    ).encode()


async def conversation_of(ctx: ToolContext, key: str, *, task_id: str) -> SubSessionRef:
    """The ref of the child ``key`` names, checked to be this session's.

    ``task_id``: the task that would continue it; a child whose ref says it runs for
    that very task is this call's own, re-run by a resumed parent.

    Raises:
        ToolError: the key is not one, is another parent's, owner's or agent type's,
            names no child of this session, or its child still runs another task.
    """
    parsed = ConversationKey.decode(key)
    if parsed is None:
        raise ToolError(f"conversation_key {key[:40]!r} is not a key run_subagent returned")
    if parsed.tenant != ctx.tenant:
        raise ToolError("conversation_key belongs to another tenant")
    if parsed.principal != (ctx.principal or "anonymous"):
        raise ToolError("conversation_key belongs to another principal")
    if parsed.parent_agent_type != ctx.agent_type:
        raise ToolError(
            f"conversation_key was issued to a {parsed.parent_agent_type!r} agent, "
            f"not to this {ctx.agent_type!r} one"
        )
    if parsed.parent_session_id != ctx.session_id:
        raise ToolError("conversation_key belongs to another parent session")
    ref = await ctx.run.store.get_subsession_ref(ctx.session_id, parsed.child_session_id)
    if ref is None:
        raise ToolError("conversation_key names no conversation of this session")
    if ref.status is SessionStatus.RUNNING and ref.tool_call_id != task_id:
        raise ToolError(
            f"the conversation of conversation_key is still running (task {ref.tool_call_id}); "
            "continue it once its result has arrived"
        )
    return ref
