"""Cost of a ``Continue`` turn beside a fresh ``Start``, measured in the same run.

    .venv/bin/python -m tests.bench.turns [--sessions 30] [--turns 20] [--store memory://]

For each of ``--sessions`` critic sessions (services/critic: two model calls per turn,
scripted): the Start->completed time of turn 1 (the baseline), then the
Continue->completed time of every later turn up to ``--turns``. A continued turn
carries the conversation so far, so later turns cost more; the ratios show how
much. Prints p50 per turn, the ratio to the baseline, and the p50 of the RPC alone
(``Start`` or ``Continue``, until its reply) with the log's length before it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from helix_transport import AgentClient, create_server, open_store
from services.critic import agent as critic


async def _turn(client: AgentClient, session_id: str, after: int) -> None:
    async for _ in client.stream(session_id, from_sequence=after):
        pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--store", default="memory://")
    args = parser.parse_args()
    store = await open_store(args.store)
    timings: dict[int, list[float]] = {t: [] for t in range(1, args.turns + 1)}
    rpcs: dict[int, list[float]] = {t: [] for t in range(1, args.turns + 1)}
    logged: dict[int, int] = {1: 0}
    async with (
        await create_server(critic, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        for n in range(args.sessions):
            session_id = f"bench-{n}-{time.time_ns()}"
            started = time.perf_counter()
            await client.start(json.dumps({"artifact": "draft 1"}), session_id=session_id)
            rpcs[1].append(time.perf_counter() - started)
            await _turn(client, session_id, 0)
            timings[1].append(time.perf_counter() - started)
            for turn in range(2, args.turns + 1):
                started = time.perf_counter()
                reply = await client.continue_session(session_id, f"draft {turn}", turn=turn)
                rpcs[turn].append(time.perf_counter() - started)
                logged[turn] = reply.from_sequence
                await _turn(client, session_id, reply.from_sequence)
                timings[turn].append(time.perf_counter() - started)
    await store.aclose()
    base = statistics.median(timings[1])
    print(
        f"critic, {args.sessions} sessions, store {args.store}; p50 per turn (ms), ratio to"
        " turn 1; p50 of the RPC alone (ms), events in the log before it"
    )
    for turn, values in timings.items():
        p50 = statistics.median(values)
        rpc = statistics.median(rpcs[turn]) * 1000
        label = "Start (turn 1, baseline)" if turn == 1 else f"Continue (turn {turn})"
        print(
            f"{label:28} {p50 * 1000:8.2f} ms   {p50 / base:5.2f}x   {rpc:6.2f} ms  {logged[turn]:6}"
        )


if __name__ == "__main__":
    asyncio.run(main())
