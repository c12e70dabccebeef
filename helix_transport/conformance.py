"""The old path of the conformance kit, kept because the README documents it.

The kit is ``helix_transport.testing.conformance``; import it from there. Its time
limits (``END_GRACE_S``...) are in ``helix_transport.testing.conformance.timing``.
"""

from __future__ import annotations

from helix_transport.testing.conformance import CheckResult, format_results, run_conformance

__all__ = ["CheckResult", "format_results", "run_conformance"]
