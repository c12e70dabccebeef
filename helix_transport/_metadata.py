"""Session metadata keys the library itself sets, in one place.

Kept apart from the modules that use them so that ``tracing`` and the delegation
tools can share a key without importing each other.
"""

from __future__ import annotations

from typing import Final

ROOT_SESSION_KEY: Final = "helix.root_session_id"
"""Metadata key carrying the root session id down a delegation tree."""

SESSION_PATH_KEY: Final = "helix.session_path"
"""Metadata key carrying the session ids from the root down to a session's parent (a
JSON list), so its requests for input name their whole path (``InputRequired.path``)."""

MAX_METADATA_VALUE: Final = 4096
"""The longest metadata value a server accepts (``StartRequest.metadata``)."""
