"""Tools: typed async functions the model can call."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ValidationError

from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport._limits import SessionLimits
from helix_transport._metadata import SessionLineage
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.agent.blockage import Blockage
from helix_transport.agent.close_policy import ChildDeclaration
from helix_transport.agent.hooks import NO_HOOKS, RunHooks
from helix_transport.agent.limits import LimitWatch
from helix_transport.agent.run_cache import RunCache
from helix_transport.agent.state import RunState
from helix_transport.store import Store
from helix_transport.transport import ClientPool

FINISH_TOOL = "__finish__"
"""The tool every agent gets: calling it with valid output ends the run."""
RESERVED_TOOL_PREFIXES = ("__", "companion__")
"""Tool names the library keeps for its own tools (``__finish__``, the companions')."""
MAX_LIVE_CHILDREN = 64
"""The default of ``Agent.max_live_children``."""


@dataclass(frozen=True, kw_only=True)
class RunServices:
    """The run's plumbing, for the library's delegation tools (remote agents, companions,
    dispatch). An agent's own tools need none of it."""

    store: Store
    """The session's store (sub-session refs live there)."""
    clients: ClientPool
    """Shared clients for calling other agent services."""
    flush: Callable[[], Awaitable[None]]
    """Wait until every emitted event is durable in the log."""
    emit_encoded: Callable[[Sequence[bytes]], None] | None = None
    """Append events given as serialized ``StreamEvent`` payload fields, stamped like
    ``ToolContext.emit`` (the remote-agent tool forwards a child's events this way)."""
    hooks: RunHooks = NO_HOOKS
    """The run's lifecycle hooks (the remote-agent tool reports delegations to them)."""
    state: RunState = field(default_factory=RunState)
    """The library's state of the run (turns, the extensions' records), checkpointed
    beside ``ToolContext.state``, which holds only the tools' own keys."""
    cache: RunCache = field(default_factory=RunCache)
    """The library's in-memory state of the run, never saved (as ``ToolContext.cache``
    is the tools' own)."""
    max_live_children: int = MAX_LIVE_CHILDREN
    """Children the session may have running at once (``Agent.max_live_children``)."""
    blockage: Blockage = field(default_factory=Blockage)
    """The step's calls that wait only for a suspended child (``agent.blockage``)."""
    session_path: tuple[str, ...] = ()
    """The session ids from the root down to this session, as each caller knows them."""
    lineage: SessionLineage = field(default_factory=SessionLineage)
    """The library's entries of the session's metadata (its root, its delegation path,
    the trace it continues), which ``ToolContext.metadata`` leaves out."""
    conversation: Sequence[dict[str, Any]] = ()
    """The run's conversation as the step began (read-only): what ``run_subagent``'s
    ``context: "inherit"`` passes to a child."""
    limits: LimitWatch | None = None
    """The session's deadline and budget at work (``None``: a context outside a run)."""


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a running tool knows about its call."""

    session_id: str
    agent_type: str
    tool_call_id: str
    step: int
    metadata: dict[str, str]
    """The session's metadata as its caller gave it: the library's own entries (root
    session id, paths, trace context) are in ``run.lineage``, not here."""
    emit: Callable[[StreamEvent], None]
    """Append an event to the session's log (its sequence is assigned by the log)."""
    run: RunServices
    """For the library's delegation tools: the store, clients, hooks and run state."""
    state: dict[str, Any] = field(default_factory=dict)
    """The run's free-form state (JSON values), shared by the run's tools and saved with
    every checkpoint: what a tool records here is durable exactly when the conversation
    that holds its result is. It holds the tools' keys only (the library's own state
    is ``run.state``)."""
    cache: dict[str, Any] = field(default_factory=dict)
    """The run's in-memory cache, shared by its tools and never saved: a restarted run
    starts with it empty, so what it holds must be rebuildable from the store."""
    principal: str = ""
    """Who owns the session: the principal that started it (empty counts as anonymous)."""
    tenant: str = ""
    """The tenant of ``principal``."""

    @property
    def idempotency_key(self) -> str:
        """A key for the effects of this call in other systems (a payment API's
        ``Idempotency-Key``, a database's unique request id).

        The same for every run of this call, a resume after a crash included, and
        different for every other call: other sessions, other turns, other owners'
        sessions of the same id. 32 hex digits (a digest of the agent type, the
        session's owner, its id, the turn and ``tool_call_id``), short enough for the
        APIs that limit their keys.
        """
        call = json.dumps(
            [
                self.agent_type,
                self.tenant,
                self.principal or "anonymous",
                self.session_id,
                self.run.state.turns.turn,
                self.tool_call_id,
            ]
        )
        return hashlib.sha256(call.encode()).hexdigest()[:32]

    @property
    def child_scope(self) -> str:
        """What ends the id of every child this session starts (see ``child_scope``)."""
        return child_scope(self.agent_type, self.principal, self.tenant)

    @property
    def delegation_path(self) -> tuple[str, ...]:
        """The agent types from the root down to this session's parent (empty for a
        root), as its ``Start`` carried them (``StartRequest.delegation_path``)."""
        return self.run.lineage.delegation_path

    def child_limits(self, own: SessionLimits = SessionLimits.none) -> SessionLimits:
        """The limits of a child this call starts (its ``StartRequest.limits``): the
        smaller of the child's ``own`` and what this session has left of its own."""
        watch = self.run.limits
        return own if watch is None else watch.for_child(own)

    @property
    def child_delegation_path(self) -> tuple[str, ...]:
        """The ``delegation_path`` of every child this session starts: its own and its type."""
        return (*self.delegation_path, self.agent_type)


def child_scope(agent_type: str, principal: str, tenant: str = "") -> str:
    """A digest of a parent's agent type and owner, the last part of its children's ids.

    A child's id must be a function of its parent alone, so that a resumed parent
    rejoins the child instead of starting another. Session ids are caller-chosen, so two
    parents (of two agent types, or of two owners on separate stores) can share one;
    when their services present one client identity to the child's service, a child id
    made of the parent's session id and the tool call id alone would hand one user the
    other's child. With this scope their children's ids differ.
    """
    # JSON keeps the three apart whatever they hold; "" is how records without an
    # owner say anonymous (see server._ownership).
    owner = json.dumps([agent_type, tenant, principal or "anonymous"])
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")
"""What a session id is made of: the server refuses any other (see server._validation)."""
MAX_SESSION_ID = 512
"""The longest session id a server accepts."""

_KIND = re.compile(r"[a-z]+")


def derived_session_id(parent_session_id: str, kind: str, key: str, scope: str) -> str:
    """The session id of a child: ``{parent_session_id}-{kind}-{key}-{scope}`` when that
    is a valid session id, else ``{prefix}-{kind}-{digest}``.

    The plain form is kept whenever it is valid, so a parent that was delegating before
    this function existed rejoins its child. Otherwise (a parent id near the 512-character
    limit, one nested many levels deep, a provider's tool call id with ``/``, ``+`` or
    ``=``, a parent id that is not a session id itself) ``digest`` is the SHA-256 of all
    four inputs, and ``prefix`` the longest readable start of the parent's id that fits:
    the result is always valid, the same in every process, and distinct for distinct
    inputs (up to the digest). Ending in 64 hex digits, it never equals a plain id, which
    ends with ``-`` and a 16-digit ``scope`` (``child_scope``).

    Args:
        parent_session_id: the parent's session id (any string).
        kind: what the child is (``remote``, ``agent``, ``task``): lower-case letters.
        key: what names the child within its parent (a tool call id, a name).
        scope: the parent's ``child_scope``.

    Raises:
        UsageError: ``kind`` is not lower-case letters.
    """
    if not _KIND.fullmatch(kind):
        raise UsageError(f"child id kind {kind!r} must be lower-case letters")
    plain = f"{parent_session_id}-{kind}-{key}-{scope}"
    if len(plain) <= MAX_SESSION_ID and SESSION_ID.fullmatch(plain):
        return plain
    # JSON keeps the four apart whatever they hold, and escapes lone surrogates.
    inputs = json.dumps([parent_session_id, kind, key, scope])
    suffix = f"-{kind}-{hashlib.sha256(inputs.encode()).hexdigest()}"
    readable = SESSION_ID.match(parent_session_id)
    prefix = readable.group()[: MAX_SESSION_ID - len(suffix)] if readable else ""
    return prefix + suffix if prefix else suffix[1:]


ToolFn = Callable[[ToolContext, Any], Awaitable[Any]]


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool: a name, a description, an argument schema and an async function.

    Arguments are validated by ``args_model`` and passed as that model; a tool built
    from a JSON schema alone (``parameters``, e.g. from a remote ``Describe``) gets
    the parsed JSON object and leaves validation to its callee.
    """

    name: str
    description: str
    args_model: type[BaseModel] | None
    fn: ToolFn
    parameters: dict[str, Any] | None = None
    """The JSON schema of the arguments when there is no ``args_model``."""
    timeout_s: float | None = None
    """Seconds before the call fails with a timeout result; ``None`` for no limit."""
    approval: bool | Callable[[Any], bool] = False
    """Whether a person approves each call before it runs: always (``True``), or when
    this function of the parsed arguments returns true (raising counts as true). The
    session waits for the answer durably (``docs/human-in-the-loop.md``)."""
    client: bool = False
    """Executed by the client: the caller supplies the result (``client_tool``)."""
    input_timeout_s: float | None = None
    """Seconds a call may wait for its approval or client result before it becomes an
    error result the model sees; ``None``: it waits as long as it takes."""
    child: ChildDeclaration | None = None
    """The child a call starts and its close policy (a remote agent tool)."""
    once: bool | None = None
    """Whether a call runs at most once, crashes included (``docs/crash-recovery.md``).

    ``True``: the call is recorded as started in the store before the tool runs, and
    its result as soon as it returns; a run resumed after a crash never runs it again:
    it uses the recorded result, or tells the model the call's outcome is unknown.
    ``None`` (the default): at most once when every call waits for an approval
    (``approval=True``) or is a client's (``client``), else at least once (a call a
    crash cut off runs again when the session resumes). ``False`` is that "at least
    once", and is refused where every call is at most once already."""

    def __post_init__(self) -> None:
        if self.client and self.approval is not False:
            raise UsageError(
                f"tool {self.name!r}: a client tool cannot also require approval "
                "(the client that runs it decides)"
            )
        if self.once is False and (self.client or self.approval is True):
            what = "a client tool's result is recorded" if self.client else "an approved call runs"
            raise UsageError(
                f"tool {self.name!r}: once=False cannot be declared: {what} at most once, "
                "never again after a crash"
            )
        if self.input_timeout_s is not None and not self.input_timeout_s > 0:
            raise UsageError(f"tool {self.name!r}: input_timeout_s must be positive")
        if self.input_timeout_s is not None and not (self.client or self.approval):
            raise UsageError(f"tool {self.name!r}: input_timeout_s needs approval or a client tool")

    def input_kind(self, args: Any) -> str | None:
        """``"client_result"``, ``"approval"`` or ``None``: what input a call with the
        parsed ``args`` waits for before it runs."""
        if self.client:
            return "client_result"
        if self.approval is True:
            return "approval"
        if self.approval is False:
            return None
        try:
            return "approval" if self.approval(args) else None
        except Exception:  # an approval rule that fails must not let the call through
            return "approval"

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema litellm sends to the model."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": (
                    self.args_model.model_json_schema()
                    if self.args_model is not None
                    else self.parameters or {"type": "object"}
                ),
            },
        }

    def parse_args(self, arguments_json: str) -> Any:
        """Validate the model's arguments.

        Raises:
            ToolArgumentError: the arguments are not valid JSON or fail the schema.
        """
        if self.args_model is None:
            try:
                value = json.loads(arguments_json or "{}")
            except ValueError as exc:
                raise ToolArgumentError(self.name, f"not valid JSON: {exc}") from exc
            if not isinstance(value, dict):
                raise ToolArgumentError(self.name, "arguments must be a JSON object")
            return value
        try:
            return self.args_model.model_validate_json(arguments_json or "{}")
        except ValidationError as exc:
            raise ToolArgumentError(self.name, describe_validation_error(exc)) from exc


class ToolError(Exception):
    """Raise from a tool to hand ``{"error": message}`` back to the model.

    The run goes on: the model decides what to do with a failed tool call.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolArgumentError(ToolError):
    """The model called a tool with bad arguments; the message goes back to it."""

    def __init__(self, tool_name: str, detail: str) -> None:
        super().__init__(f"invalid arguments for {tool_name}: {detail}")


def describe_validation_error(exc: ValidationError) -> str:
    """``loc: msg; loc: msg`` for a pydantic validation error."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
    )


@overload
def tool(fn: ToolFn) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    approval: bool | Callable[[Any], bool] = False,
    input_timeout_s: float | None = None,
    once: bool | None = None,
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    approval: bool | Callable[[Any], bool] = False,
    input_timeout_s: float | None = None,
    once: bool | None = None,
) -> Tool | Callable[[ToolFn], Tool]:
    """Make a ``Tool`` from ``async def fn(ctx: ToolContext, args: SomeModel) -> result``.

    The name defaults to the function's, the description to its docstring and the
    argument model to the annotation of its second parameter. The result may be a
    pydantic model or anything ``json.dumps`` accepts. Usable bare (``@tool``) or
    with options (``@tool(timeout_s=5)``, ``@tool(approval=True, input_timeout_s=3600)``).

    ``@tool(once=True)`` declares a tool with effects that must not happen twice (a
    payment, an email): each call runs at most once, crashes included (``Tool.once``);
    pass ``ctx.idempotency_key`` to the systems it calls.
    """

    def build(f: ToolFn) -> Tool:
        params = list(inspect.signature(f).parameters.values())
        hints = get_type_hints(f)
        if len(params) != 2 or not _is_model(hints.get(params[1].name)):
            raise UsageError(
                f"tool {f.__name__!r} must be `async def {f.__name__}(ctx: ToolContext, "
                "args: SomePydanticModel)`"
            )
        return Tool(
            name=name or f.__name__,
            description=description or inspect.getdoc(f) or f.__name__,
            args_model=hints[params[1].name],
            fn=f,
            timeout_s=timeout_s,
            approval=approval,
            input_timeout_s=input_timeout_s,
            once=once,
        )

    return build(fn) if fn is not None else build


def client_tool(
    name: str,
    *,
    description: str,
    args_model: type[BaseModel] | None = None,
    parameters: dict[str, Any] | None = None,
    input_timeout_s: float | None = None,
) -> Tool:
    """A tool the client executes: the session asks for its result (an
    ``input_required`` event) and waits, durably, until the caller sends it
    (``SubmitInput``) or ``input_timeout_s`` passes."""

    async def _never(ctx: ToolContext, args: Any) -> Any:
        raise ToolError(f"tool {name!r} is executed by the client")  # the loop never calls it

    return Tool(
        name=name,
        description=description,
        args_model=args_model,
        parameters=parameters,
        fn=_never,
        client=True,
        input_timeout_s=input_timeout_s,
    )


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def dump_result(value: Any) -> str:
    """A tool's return value as the JSON string the model sees."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    # NaN and Infinity are not JSON: the model, and every other language's parser of
    # ToolEnd.result_json, would get text it cannot read. They fail the call instead.
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError as exc:
        raise ToolError(f"the tool's result is not JSON: {exc}") from None


async def reserve_children(ctx: ToolContext, child_ids: Sequence[str]) -> None:
    """Count ``child_ids`` among the session's live children before they start.

    Live: refs still running, and children reserved in this run whose ref is not
    written yet (concurrent tool calls each see the others'). A child that already has
    a ref (a rejoin, a restart of a known child) is not new. Per parent session: a
    tree's total would need every level's refs.

    Raises:
        ToolError: the new children would take the session past ``max_live_children``.
    """
    limit = ctx.run.max_live_children
    if limit <= 0:
        return
    refs = await ctx.run.store.list_subsession_refs(ctx.session_id)
    # No await from here on: the count and the reservation are one step.
    starting = ctx.run.cache.starting
    starting -= {r.child_session_id for r in refs}
    live = starting | {r.child_session_id for r in refs if r.status is SessionStatus.RUNNING}
    known = live | {r.child_session_id for r in refs}
    new = {c for c in child_ids if c not in known}
    if new and len(live) + len(new) > limit:
        raise ToolError(
            f"cannot start {len(new)} more child(ren): this session has {len(live)} running "
            f"and may have at most {limit} at once; wait for some to finish"
        )
    starting |= new


def reserved_tool_name(name: str) -> bool:
    """True for a name kept for the library's own tools (``RESERVED_TOOL_PREFIXES``)."""
    return name.startswith(RESERVED_TOOL_PREFIXES)


_LIBRARY_TOOLS: weakref.WeakValueDictionary[int, Tool] = weakref.WeakValueDictionary()


def library_tool(tool: Tool) -> Tool:
    """Mark ``tool`` as one the library attaches, so it may have a reserved name.

    For helix_transport's own modules (companions, dispatch); an agent's own tools
    with such names are refused by ``Agent``.
    """
    _LIBRARY_TOOLS[id(tool)] = tool
    return tool


def is_library_tool(tool: Tool) -> bool:
    """True for a tool marked by ``library_tool`` (this very object)."""
    return _LIBRARY_TOOLS.get(id(tool)) is tool
