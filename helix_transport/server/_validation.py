"""Checks on incoming requests; each failure names the field it is about.

Failures are ``InvalidArgument`` with every violation found (sent as google.rpc
``BadRequest`` field violations). Sizes are checked before anything is parsed, and
JSON nesting before the JSON parser sees the text.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Sequence
from typing import Any

from google.protobuf.duration_pb2 import Duration
from pydantic import BaseModel, ValidationError

from helix_transport._exceptions import InvalidArgument, SessionStateConflict
from helix_transport._limits import SessionLimits
from helix_transport._metadata import (
    DELEGATION_PATH_KEY,
    INHERITED_CONTEXT_KEY,
    MAX_METADATA_VALUE,
    VIRTUAL_TOOLS_KEY,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.tools import MAX_SESSION_ID, SESSION_ID
from helix_transport.server.limits import Limits

MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY = 128
MAX_REASON = 4096
MAX_SEQUENCE = (1 << 53) - 1
"""No log gets this long; a larger ``from_sequence`` is a broken or hostile client
(and past what JSON-based clients can even represent exactly)."""
MAX_VIOLATIONS = 20
"""Field violations reported per request; the rest are counted, not listed."""

# A JSON string literal (escapes included), and an innermost empty array or object.
# An unclosed string (even one ending in a lone backslash) runs to the end of the
# text: were a match to fail there, it would be retried from every quote inside the
# string, quadratic in the text's size.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_INNERMOST = re.compile(r"\[\]|\{\}")
_NOT_BRACKET = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))


def session_id(value: str, *, field: str = "session_id", generate: bool = False) -> str:
    """A valid session id (a new one when empty and ``generate``)."""
    if not value:
        if generate:
            return uuid.uuid4().hex
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_SESSION_ID:
        raise InvalidArgument(field, f"longer than {MAX_SESSION_ID} characters")
    if not SESSION_ID.fullmatch(value):  # `$` would let a final newline through
        raise InvalidArgument(
            field, "must be 1-512 characters from [A-Za-z0-9_.:-], starting with a letter or digit"
        )
    return value


_AGENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")  # Agent.name's rule
MAX_DELEGATION_PATH = 256
"""Entries a ``delegation_path`` may hold whatever the depth limit (0 turns that off)."""


def delegation_path(
    path: Sequence[str],
    metadata: dict[str, str],
    *,
    agent: Agent,
    limits: Limits,
    session_id: str,
    virtual: bool = False,
) -> dict[str, str]:
    """``metadata`` with the checked ``delegation_path`` kept under ``DELEGATION_PATH_KEY``
    (a caller's own entry under that key is replaced: the path is the field's).

    Raises:
        InvalidArgument: an entry is not an agent name, or the path is absurdly long.
        SessionStateConflict: (FAILED_PRECONDITION) the path is ``max_delegation_depth``
            long already, or holds ``agent``'s type and ``agent`` is not recursive (a
            ``virtual`` child's path may end with it: its parent is of its type).
    """
    if len(path) > MAX_DELEGATION_PATH:
        raise InvalidArgument("delegation_path", f"more than {MAX_DELEGATION_PATH} entries")
    for index, entry in enumerate(path):
        if not _AGENT_NAME.fullmatch(entry):
            raise InvalidArgument(f"delegation_path[{index}]", "not an agent name")
    shown = " > ".join([*path, agent.name])
    most = limits.max_delegation_depth
    if most and len(path) >= most:
        raise SessionStateConflict(
            session_id,
            f"cannot start: delegation path {shown} is {len(path) + 1} levels deep, more "
            f"than this service's maximum of {most}",
        )
    # A virtual child has no run_subagent of its own: its one return to the type ends there.
    above = path[:-1] if virtual and path and path[-1] == agent.name else path
    if agent.name in above and not agent.recursive:
        raise SessionStateConflict(
            session_id,
            f"cannot start: delegation path {shown} returns to {agent.name!r}, which does not "
            "allow recursion",
        )
    kept = {k: v for k, v in metadata.items() if k != DELEGATION_PATH_KEY}
    return {**kept, DELEGATION_PATH_KEY: json.dumps(list(path))} if path else kept


def start_metadata(
    request: pb.StartRequest, session_id: str, *, agent: Agent, limits: Limits
) -> dict[str, str]:
    """A ``Start``'s metadata checked, with its checked ``delegation_path`` in it."""
    checked = subagent_options(request, metadata(dict(request.metadata)), agent=agent)
    return delegation_path(
        request.delegation_path,
        checked,
        agent=agent,
        limits=limits,
        session_id=session_id,
        virtual=request.subagent.virtual,
    )


MAX_CONTEXT_BYTES = 1 << 20
"""The longest ``SubagentOptions.context_json`` a server accepts."""


def subagent_options(
    request: pb.StartRequest, metadata: dict[str, str], *, agent: Agent
) -> dict[str, str]:
    """``metadata`` with the checked ``StartRequest.subagent`` kept under its library
    keys (a caller's own entries under them are dropped: they are the field's).

    Raises:
        InvalidArgument: a virtual child not started by a parent of this agent type,
            tools without ``virtual`` or not this agent's, or ``context_json`` that is
            not a JSON array of messages within 1 MiB.
    """
    options = request.subagent
    kept = {
        k: v for k, v in metadata.items() if k not in (VIRTUAL_TOOLS_KEY, INHERITED_CONTEXT_KEY)
    }
    if options.virtual:
        path = request.delegation_path
        if not path or path[-1] != agent.name:
            raise InvalidArgument(
                "subagent.virtual", f"a virtual child's parent must be of type {agent.name!r}"
            )
        known = {t.name for t in agent.tools}
        for index, name in enumerate(options.tools):
            if name not in known:
                raise InvalidArgument(f"subagent.tools[{index}]", f"{name!r} is not a tool here")
        kept[VIRTUAL_TOOLS_KEY] = json.dumps(list(options.tools))
    elif options.tools:
        raise InvalidArgument("subagent.tools", "only a virtual child's tools are chosen")
    if options.context_json:
        kept[INHERITED_CONTEXT_KEY] = _context(options.context_json)
    return kept


def _context(text: str) -> str:
    field = "subagent.context_json"
    if len(text.encode()) > MAX_CONTEXT_BYTES:
        raise InvalidArgument(field, f"larger than {MAX_CONTEXT_BYTES} bytes")
    if "\x00" in text:  # PostgreSQL refuses NUL
        raise InvalidArgument(field, "must not contain NUL characters")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(field, f"not JSON: {exc}") from None
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    ):
        raise InvalidArgument(field, "must be a JSON array of messages with a role")
    return text


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """True when ``text`` nests arrays/objects deeper than ``max_depth``.

    Linear and in C (regex, translate), without building anything: string literals
    are dropped, then each pass removes the innermost ``[]``/``{}`` pairs, one level.
    Unbalanced text is left for the parser to reject.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return False
    brackets = _JSON_STRING.sub("", text).translate(_NOT_BRACKET)
    for _ in range(max_depth):
        brackets, removed = _INNERMOST.subn("", brackets)
        if not removed or not brackets:
            return False
    return _INNERMOST.search(brackets) is not None


def agent_input(
    model: type[BaseModel],
    input_json: str,
    *,
    limits: Limits = Limits.default,
    field: str = "input_json",
) -> BaseModel:
    """``input_json`` parsed and validated against the agent's input model; violations
    name ``field`` (``message`` for a fresh turn's input)."""
    size = len(input_json.encode("utf-8", "surrogatepass"))
    if size > limits.max_input_bytes:
        raise InvalidArgument(field, f"larger than {limits.max_input_bytes} bytes ({size})")
    if json_depth_exceeds(input_json, limits.max_json_depth):
        raise InvalidArgument(field, f"nested deeper than {limits.max_json_depth} levels")
    if ("NaN" in input_json or "Infinity" in input_json) and _has_non_json_number(input_json):
        # pydantic and json.loads read these; JSON.parse, Go and serde do not, and the
        # text is handed on as is (run_started.input_json, a child's input).
        raise InvalidArgument(field, "not valid JSON (NaN and Infinity are not JSON numbers)")
    try:
        return model.model_validate_json(input_json or "{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        if first["type"] == "json_invalid":
            raise InvalidArgument(field, f"not valid JSON ({first['msg']})") from None
        violations = [(_path(e["loc"], field), e["msg"]) for e in errors[:MAX_VIOLATIONS]]
        if len(errors) > MAX_VIOLATIONS:
            violations.append((field, f"{len(errors) - MAX_VIOLATIONS} more problems"))
        raise InvalidArgument(*violations[0], violations=violations) from None
    except (ValueError, RecursionError):
        raise InvalidArgument(field, "cannot be parsed as JSON") from None


def _has_non_json_number(text: str) -> bool:
    """True when ``text`` parses only with NaN or (-)Infinity as numbers; False when it
    has none outside strings, or does not parse at all (the validator says why)."""

    def refuse(constant: str) -> Any:
        raise _NonJSONNumber(constant)

    try:
        json.loads(text, parse_constant=refuse)
    except _NonJSONNumber:
        return True
    except (ValueError, RecursionError):
        return False
    return False


class _NonJSONNumber(Exception):
    pass


MAX_PATH_PART = 64
"""A path part (a dict key from the caller's input) is cut to this many characters:
the path goes back in the status trailer, which gRPC caps at 16 KiB."""


def _path(loc: tuple[int | str, ...], field: str = "input_json") -> str:
    """``input_json.items[2].name`` for pydantic's ``("items", 2, "name")``."""
    path = field
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            shown = part if len(part) <= MAX_PATH_PART else part[: MAX_PATH_PART - 1] + "…"
            path += f".{shown}"
    return path


def metadata(values: dict[str, str]) -> dict[str, str]:
    """The request metadata, within its limits, free of NUL (PostgreSQL refuses it)."""
    if len(values) > MAX_METADATA_ENTRIES:
        raise InvalidArgument("metadata", f"more than {MAX_METADATA_ENTRIES} entries")
    for key, value in values.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise InvalidArgument("metadata", f"keys must be 1-{MAX_METADATA_KEY} characters")
        if "\x00" in key:
            raise InvalidArgument("metadata", "keys must not contain NUL characters")
        shown = key if key.isprintable() else repr(key)
        if len(value) > MAX_METADATA_VALUE:
            raise InvalidArgument(
                f"metadata[{shown}]", f"longer than {MAX_METADATA_VALUE} characters"
            )
        if "\x00" in value:
            raise InvalidArgument(f"metadata[{shown}]", "must not contain NUL characters")
    return dict(values)


def from_sequence(value: int) -> int:
    """A replay position: 0 or a positive sequence, below ``MAX_SEQUENCE``.

    A position past the end of the log is not an error (the contract: a finished
    session's stream ends with no event; a running one waits for new events).
    """
    if value < 0:
        raise InvalidArgument("from_sequence", "must not be negative")
    if value > MAX_SEQUENCE:
        raise InvalidArgument("from_sequence", f"larger than {MAX_SEQUENCE}, past any log")
    return value


MAX_WAIT_S = 60.0
"""Longest ``GetStatus`` long poll; a caller wanting longer asks again."""


def wait(value: Duration) -> float:
    """A ``GetStatus`` long poll in seconds: a valid Duration, 0 to ``MAX_WAIT_S``."""
    seconds, nanos = value.seconds, value.nanos
    if abs(nanos) > 999_999_999 or (seconds and nanos and (seconds < 0) != (nanos < 0)):
        raise InvalidArgument(
            "wait", "not a valid Duration (nanos out of range or of another sign)"
        )
    total = seconds + nanos / 1e9
    if total < 0:
        raise InvalidArgument("wait", "must not be negative")
    if total > MAX_WAIT_S:
        raise InvalidArgument("wait", f"longer than {MAX_WAIT_S:g}s; ask again instead")
    return total


def reason(value: str) -> str:
    """An interrupt reason of bounded length, free of NUL."""
    if len(value) > MAX_REASON:
        raise InvalidArgument("reason", f"longer than {MAX_REASON} characters")
    if "\x00" in value:
        raise InvalidArgument("reason", "must not contain NUL characters")
    return value


def message(value: str, *, limits: Limits = Limits.default) -> str:
    """A ``Continue`` message: not empty, at most ``limits.max_input_bytes`` (as an input)."""
    if not value.strip():
        raise InvalidArgument("message", "must not be empty")
    if len(value.encode()) > limits.max_input_bytes:
        raise InvalidArgument("message", f"larger than {limits.max_input_bytes} bytes")
    return value


def submitted_input(request: pb.SubmitInputRequest, *, limits: Limits = Limits.default) -> None:
    """A ``SubmitInput``'s request id, path and answer text within their limits."""
    if not request.request_id:
        raise InvalidArgument("request_id", "must not be empty")
    if len(request.request_id) > MAX_SESSION_ID:
        raise InvalidArgument("request_id", f"longer than {MAX_SESSION_ID} characters")
    for index, entry in enumerate(request.path):
        session_id(entry, field=f"path[{index}]")
    which = request.WhichOneof("answer")
    if which is None:
        raise InvalidArgument("answer", "set approval or result")
    if which == "approval" and len(request.approval.reason) > MAX_REASON:
        raise InvalidArgument("approval.reason", f"longer than {MAX_REASON} characters")
    texts = {"result.result_json": request.result.result_json, "result.error": request.result.error}
    for field, text in texts.items():
        if len(text.encode()) > limits.max_input_bytes:
            raise InvalidArgument(field, f"larger than {limits.max_input_bytes} bytes")
        if "\x00" in text:
            raise InvalidArgument(field, "must not contain NUL characters")
    if "\x00" in request.approval.reason:
        raise InvalidArgument("approval.reason", "must not contain NUL characters")


_TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)  # 0001-01-01 .. 9999-12-31, as protobuf


def start_limits(
    request: pb.StartRequest, *, time_remaining: float | None, now: float
) -> SessionLimits:
    """A ``Start``'s ``limits``, checked. Absent, the call's gRPC deadline (when it has
    one) is the session's deadline; present, it is all there is (see the proto)."""
    if not request.HasField("limits"):
        if time_remaining is None:
            return SessionLimits.none
        return SessionLimits(deadline=now + max(0.0, time_remaining))
    given = request.limits
    violations: list[tuple[str, str]] = []
    if given.HasField("deadline"):
        stamp = given.deadline
        low, high = _TIMESTAMP_SECONDS
        if not (low <= stamp.seconds <= high and 0 <= stamp.nanos <= 999_999_999):
            violations.append(("limits.deadline", "not a valid timestamp"))
        elif stamp.seconds + stamp.nanos / 1e9 <= now:
            violations.append(("limits.deadline", "has passed already"))
    if given.HasField("budget_tokens") and given.budget_tokens < 0:
        violations.append(("limits.budget_tokens", "must not be negative"))
    if given.HasField("budget_usd") and not (
        math.isfinite(given.budget_usd) and given.budget_usd >= 0
    ):
        violations.append(("limits.budget_usd", "must be a finite amount, not negative"))
    if violations:
        raise InvalidArgument(*violations[0], violations=violations)
    return SessionLimits.from_proto(given)
