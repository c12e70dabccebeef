"""How ``Continue`` finds a session's turns, beside reading the whole log, per store.

    python -m helix_transport.bench.turn_lookup [--stores memory,sqlite,redis,postgres]

Builds one session per shape (turns x text deltas per turn) as the run loop would
leave it: each turn's ``turn_started``, its deltas, a checkpoint at the turn's end
naming the turn and where it began, and its terminal event. Then times, alternating,
``count_turns`` (the last checkpoint, and the log after it: what ``Continue`` does)
against ``read_turns`` from sequence 0 (the whole log: the baseline), and checks both
count the same turns. Prints p50 of each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.state import RunState, TurnState, joined_state
from helix_transport.agent.turns import count_turns, read_turns
from helix_transport.bench.streams import STORES, bench_store
from helix_transport.store import Checkpoint, SessionRecord, Store

SHAPES = ((20, 10), (20, 500), (50, 1_000))
"""(turns, text deltas per turn): a short chat, then long-lived sessions that stream."""


async def _build(store: Store, session_id: str, turns: int, deltas: int) -> int:
    """The session's log and last checkpoint; its last sequence."""
    await store.create_session(
        SessionRecord(session_id=session_id, agent_type="bench", input_json="{}", input_hash="")
    )
    last = 0
    for turn in range(1, turns + 1):
        events = [pb.StreamEvent(text_delta=pb.TextDelta(text="word ")) for _ in range(deltas)]
        state: dict[str, object] = {}
        if turn > 1:
            events.insert(0, pb.StreamEvent(turn_started=pb.TurnStarted(turn=turn, message="m")))
            state = joined_state({}, RunState(turns=TurnState(turn=turn, sequence=last + 1)))
        for start in range(0, len(events), 500):
            last = await store.append(
                session_id, events[start : start + 500], expected_sequence=last
            )
        messages = [{"role": "user", "content": "m"}] * (2 * turn)
        checkpoint = Checkpoint(
            session_id=session_id, step=turn, messages=messages, last_sequence=last, state=state
        )
        await store.save_checkpoint(checkpoint)
        done = pb.StreamEvent(completed=pb.Completed(output_json="{}"))
        last = await store.append(session_id, [done], expected_sequence=last)
    return last


async def _measure(store: Store, name: str, turns: int, deltas: int, runs: int) -> None:
    session_id = f"lookup-{turns}x{deltas}-{time.time_ns()}"
    events = await _build(store, session_id, turns, deltas)
    whole: list[float] = []
    tail: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        found = await read_turns(store, session_id)
        whole.append(time.perf_counter() - started)
        started = time.perf_counter()
        counted = await count_turns(store, session_id)
        tail.append(time.perf_counter() - started)
        if not 1 + len(found) == counted.count == turns:
            raise RuntimeError(f"{name}: {1 + len(found)} and {counted.count} of {turns} turns")
    w, t = statistics.median(whole) * 1000, statistics.median(tail) * 1000
    print(
        f"{name:9} {turns:3} turns x {deltas:5} deltas ({events:6,} events): whole log"
        f" {w:8.2f} ms, from the checkpoint {t:6.2f} ms, {w / t:6.1f}x"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="helix-turn-lookup-") as tmp:
        for name in args.stores.split(","):
            async with bench_store(name, Path(tmp)) as store:
                for turns, deltas in SHAPES:
                    await _measure(store, name, turns, deltas, args.runs)


if __name__ == "__main__":
    asyncio.run(main())
