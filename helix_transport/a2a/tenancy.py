"""A2A's ``tenant`` request field, onto helix's tenant.

A principal belongs to exactly one tenant, which its credentials name (a token file's
third column, a JWT's tenant claim, a client certificate's O; ``docs/security.md``);
its sessions live in that tenant and nowhere else. So a request's ``tenant`` is a
claim to check, never a choice to honour:

- empty, or the caller's own tenant: the request goes on as the caller (the sessions
  it starts land in the caller's tenant, the same ones gRPC's ``ListSessions`` lists);
- another tenant: the caller has nothing there and may create nothing there.
  A task read (``GetTask``, ``CancelTask``, ``SubscribeToTask``, a message answering a
  ``taskId``) is ``TaskNotFound``, the same answer as for another principal's task or
  an unknown one; ``ListTasks`` lists nothing; a message that would start or continue
  a session is ``InvalidParams`` naming ``tenant``. gRPC requests carry no tenant, and
  the gRPC path's answer to an authenticated caller reaching beyond its rights is
  ``PERMISSION_DENIED``, which A2A has no error for; invalid params is A2A's nearest
  error that names the field, and it tells nothing about another tenant (the answer
  is the same whether or not the tenant, or a session in it, exists).

The dispatchers of a2a-sdk put the tenant in ``ServerCallContext.tenant`` whatever the
binding (JSON-RPC: the request's field; HTTP+JSON: the ``/{tenant}/...`` path; gRPC:
the request's field); the request's own field is read when a caller skips them.
"""

from __future__ import annotations

from a2a.server.context import ServerCallContext
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from helix_transport.server.edge import Principal


def requested(params: object, context: ServerCallContext) -> str:
    """The tenant a request names ("" for none)."""
    named = getattr(params, "tenant", "")
    return context.tenant or (named if isinstance(named, str) else "")


def foreign(params: object, context: ServerCallContext, caller: Principal) -> bool:
    """True when the request names a tenant that is not ``caller``'s."""
    tenant = requested(params, context)
    return bool(tenant) and tenant != caller.tenant


def check(params: object, context: ServerCallContext, caller: Principal) -> None:
    """Refuse a request naming a tenant other than ``caller``'s, as the module says.

    Raises:
        InvalidParamsError: a message that would start or continue a session there.
        TaskNotFoundError: any other request (a task read, or a message on a task).
    """
    if not foreign(params, context, caller):
        return
    if isinstance(params, a2a.SendMessageRequest) and not params.message.task_id:
        problem = "not the caller's tenant (leave it empty for the caller's own)"
        raise InvalidParamsError(f"tenant: {problem}", data={"field": "tenant", "problem": problem})
    raise TaskNotFoundError()
