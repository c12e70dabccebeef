"""How long the conformance kit waits: the tunable time limits of its checks.

The kit reads these when a check runs, so a test of a deliberately broken service
can shorten them (``monkeypatch.setattr(timing, "END_GRACE_S", 0.5)``).
"""

from __future__ import annotations

END_GRACE_S = 5.0
"""How long a stream may stay open after its terminal event before it counts as not ending
(and how late a long poll may answer after the session's end or its wait)."""
WAIT_FINISHED_S = 10.0
"""The long poll the kit asks of a finished session, which must not wait at all."""
WAIT_PROMPT_S = 5.0
"""How soon that long poll of a finished session must answer."""
WAIT_RUNNING_S = 5.0
"""The long poll the kit asks of its main session while it runs; a RUNNING reply within
half of it means the service does not implement ``wait``."""
SUSPENDED_OPEN_S = 2.0
"""How long the kit watches a suspended session's stream, which must stay open (and quiet:
no event until an answer wakes the session)."""
ABORT_SUSPENDED_S = 10.0
"""How long an accepted abort of a suspended session (which runs nothing) may take to end it."""
