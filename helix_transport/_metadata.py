"""Session metadata keys the library itself sets, in one place.

Kept apart from the modules that use them so that ``tracing`` and the delegation
tools can share a key without importing each other.
"""

from __future__ import annotations

from typing import Final

ROOT_SESSION_KEY: Final = "helix.root_session_id"
"""Metadata key carrying the root session id down a delegation tree."""
