"""What a resumed parent reads to rejoin its running children, shared or one scan each.

    python -m helix_transport.bench.rejoin [--children 1000] [--events 10] [--store sqlite]

A parent that crashed mid-fan-out rejoins every child still running, and each
needs the last of its events the parent's log holds. Builds such a log
(``--children`` tool calls, ``--events`` forwarded events each, interleaved as a
fan-out leaves them), then times the lookups for every child at once two ways,
alternating: one ``ForwardedSoFar`` shared by the run (what the remote tool does)
and one per child (a scan of the whole log each: the code before it). Prints p50
wall time of each and their ratio, and checks both find the same sequences.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench.streams import bench_store
from helix_transport.log.children import ForwardedSoFar
from helix_transport.store import EventLogStore, SessionRecord, Store


async def _build(store: Store, session_id: str, children: int, events: int) -> None:
    record = SessionRecord(
        session_id=session_id, agent_type="bench", input_json="{}", input_hash=""
    )
    await store.create_session(record)
    last = 0
    for sequence in range(1, events + 1):
        batch = [
            pb.StreamEvent(
                child_event=pb.ChildEvent(
                    tool_call_id=f"call_{n}", event=pb.StreamEvent(sequence=sequence)
                )
            )
            for n in range(children)
        ]
        for start in range(0, len(batch), 500):
            last = await store.append(
                session_id, batch[start : start + 500], expected_sequence=last
            )


async def _lookups(
    store: EventLogStore, session_id: str, children: int, *, shared: bool
) -> list[int]:
    index = ForwardedSoFar(store, session_id)

    async def one(n: int) -> int:
        mine = index if shared else ForwardedSoFar(store, session_id)
        return await mine.last(f"call_{n}")

    # Every lookup ends before the store may close, even when one has failed.
    results = await asyncio.gather(*(one(n) for n in range(children)), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [result for result in results if isinstance(result, int)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="helix-rejoin-") as tmp:
        async with bench_store(args.store, Path(tmp)) as store:
            await _build(store, "parent", args.children, args.events)
            times: dict[bool, list[float]] = {True: [], False: []}
            failed: HelixError | None = None
            for _ in range(args.runs):
                for shared in (True, False):
                    started = time.perf_counter()
                    try:
                        found = await _lookups(store, "parent", args.children, shared=shared)
                    except HelixError as exc:
                        if shared:
                            raise
                        failed = exc  # the baseline: a scan per child can exhaust a pool
                        continue
                    times[shared].append(time.perf_counter() - started)
                    if found != [args.events] * args.children:
                        raise RuntimeError(f"shared={shared}: wrong sequences found")
    one = statistics.median(times[True])
    each = (
        f"{statistics.median(times[False]) * 1000:.1f} ms, "
        f"{statistics.median(times[False]) / one:.0f}x"
        if times[False]
        else f"failed: {failed}"
    )
    print(
        f"{args.store}, {args.children} children x {args.events} events"
        f" ({args.children * args.events:,} in the log): shared {one * 1000:.1f} ms,"
        f" a scan each {each}"
    )


if __name__ == "__main__":
    asyncio.run(main())
