"""A short soak in the default run: concurrent sessions on a real ``helix-mesh serve``,
clients leaving and rejoining at random; every event seen exactly once.

The long run is ``python -m tests.soak.soak --sessions 200 --duration 60`` (figures in
the README); memory figures are printed, not asserted (they are benchmarks).
"""

from __future__ import annotations

import json
from typing import cast

from tests.soak.soak import run_soak


async def test_short_soak_every_session_completes_and_every_event_arrives_once() -> None:
    summary = await run_soak(sessions=24, duration_s=5, store="sqlite", seed=7)
    print(json.dumps(summary, indent=2))
    assert summary["violations"] == [], summary["violations"]
    # Counters of the soak's Figures: ints, in a summary typed for json.dumps.
    completed = cast(int, summary["sessions_completed"])
    rejoins, reconnects = cast(int, summary["rejoins"]), cast(int, summary["channel_reconnects"])
    assert summary["sessions_started"] == completed >= 24
    assert rejoins > 0 and reconnects > 0
    assert summary["store_sessions_checked"] == summary["sessions_started"]
