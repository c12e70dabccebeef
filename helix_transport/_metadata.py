"""Session metadata keys the library itself sets, in one place, and their typed view.

Kept apart from the modules that use them so that ``tracing`` and the delegation
tools can share a key without importing each other. They travel in gRPC requests
(``StartRequest.metadata``) and are stored with the session; in a run they are split
off (``split_metadata``): tools see only the caller's entries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

ROOT_SESSION_KEY: Final = "helix.root_session_id"
"""Metadata key carrying the root session id down a delegation tree."""

SESSION_PATH_KEY: Final = "helix.session_path"
"""Metadata key carrying the session ids from the root down to a session's parent (a
JSON list), so its requests for input name their whole path (``InputRequired.path``)."""

MAX_METADATA_VALUE: Final = 4096
"""The longest metadata value a server accepts (``StartRequest.metadata``)."""

DELEGATION_PATH_KEY: Final = "helix.delegation_path"
"""Metadata key of the session's ``StartRequest.delegation_path`` (a JSON list), set by
the server that took the ``Start``: a resumed run sends its children the path it was
started with."""

TRACE_MODE_KEY: Final = "helix.trace"
"""Metadata key: ``parent`` when a root session's runs nest under the caller's context
recorded beside it (``traceparent``; see ``helix_transport.tracing.rpc``)."""

TRACE_CONTEXT_KEYS: Final = frozenset({"traceparent", "tracestate"})
"""The W3C trace context a session's metadata records: a parent's delegation span, or
the caller's context of a joined root ``Start``."""

VIRTUAL_TOOLS_KEY: Final = "helix.virtual_tools"
"""Metadata key of a virtual sub-agent's tools (``SubagentOptions.tools``, a JSON list),
set by the server that took the ``Start``; absent for every other session."""

INHERITED_CONTEXT_KEY: Final = "helix.inherited_context"
"""Metadata key of the parent's conversation a sub-agent's first turn is shown
(``SubagentOptions.context_json``), set by the server that took the ``Start``. Stored
with the session (not bounded like a caller's value), left out of ``run_started``."""

LIBRARY_KEYS: Final = frozenset(
    {
        ROOT_SESSION_KEY,
        SESSION_PATH_KEY,
        DELEGATION_PATH_KEY,
        TRACE_MODE_KEY,
        VIRTUAL_TOOLS_KEY,
        INHERITED_CONTEXT_KEY,
    }
    | TRACE_CONTEXT_KEYS
)
"""The session metadata keys the library sets and reads; the rest is the caller's."""


@dataclass(frozen=True, kw_only=True)
class SessionLineage:
    """The library's entries of a session's metadata, typed: where the session sits in
    its tree, and the trace it continues. A tool sees the rest (``ToolContext.metadata``);
    the library's tools read these (``RunServices.lineage``)."""

    root_session_id: str = ""
    """The tree's root session (``ROOT_SESSION_KEY``); empty for a root."""
    session_path: tuple[str, ...] = ()
    """The session ids from the root down to the session's parent (``SESSION_PATH_KEY``)."""
    delegation_path: tuple[str, ...] = ()
    """The agent types from the root down to the session's parent (``DELEGATION_PATH_KEY``)."""
    trace_mode: str = ""
    """``TRACE_MODE_KEY``'s value (``parent``: a joined root)."""
    trace_context: Mapping[str, str] = field(default_factory=dict)
    """The recorded W3C trace context (``TRACE_CONTEXT_KEYS``)."""
    virtual_tools: tuple[str, ...] | None = None
    """A virtual sub-agent's tools (``VIRTUAL_TOOLS_KEY``); ``None``: not a virtual one."""
    inherited_context: tuple[dict[str, Any], ...] = ()
    """The parent's messages its first turn is shown (``INHERITED_CONTEXT_KEY``)."""

    @classmethod
    def of(cls, metadata: Mapping[str, str]) -> SessionLineage:
        """The library's entries of ``metadata`` (a malformed path reads as none)."""
        return cls(
            root_session_id=metadata.get(ROOT_SESSION_KEY, ""),
            session_path=_json_list(metadata.get(SESSION_PATH_KEY, "")),
            delegation_path=_json_list(metadata.get(DELEGATION_PATH_KEY, "")),
            trace_mode=metadata.get(TRACE_MODE_KEY, ""),
            trace_context={k: v for k, v in metadata.items() if k in TRACE_CONTEXT_KEYS},
            virtual_tools=(
                _json_list(metadata[VIRTUAL_TOOLS_KEY]) if VIRTUAL_TOOLS_KEY in metadata else None
            ),
            inherited_context=_messages(metadata.get(INHERITED_CONTEXT_KEY, "")),
        )


def split_metadata(metadata: Mapping[str, str]) -> tuple[dict[str, str], SessionLineage]:
    """A session's metadata as the caller's entries and the library's (typed)."""
    user = {k: v for k, v in metadata.items() if k not in LIBRARY_KEYS}
    return user, SessionLineage.of(metadata)


def _json_list(raw: str) -> tuple[str, ...]:
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _messages(raw: str) -> tuple[dict[str, Any], ...]:
    """The chat messages of a JSON array (checked by the server that stored it)."""
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    return tuple(m for m in value if isinstance(m, dict))
