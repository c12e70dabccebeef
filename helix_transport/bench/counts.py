"""Counts that do not depend on the host's speed: Python function calls, asyncio tasks
and futures created, event-loop turns and store calls, per Start->completed of a
one-step session and per streamed event (a live stream of text deltas, minus a
one-step session), all in this process (server and client on the memory store).
Python calls are the event loop's thread's: litellm's worker threads are not counted.

``python -m helix_transport.bench.counts [--sessions 50] [--events 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from helix_transport.bench._measure import Ids
from helix_transport.bench.agents import leaf, leaf_input
from helix_transport.server.app import create_server
from helix_transport.store.memory import MemoryStore
from helix_transport.transport import AgentClient


class _Counting:
    """Counts Python calls (by top-level package) and C calls, tasks, futures and loop turns."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.counts: Counter[str] = Counter()
        self._loop: Any = loop

    def _profile(self, frame: Any, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name == __file__:  # this module's own counting wrappers
                return
            package = "helix" if "helix_transport" in name else "other"
            for part in ("litellm", "grpc", "asyncio", "google", "pydantic"):
                if f"/{part}/" in name:
                    package = part
            self.counts["calls." + package] += 1
            self.counts["calls"] += 1
        elif event == "c_call":  # a protobuf setter, a bytes join...
            self.counts["C calls"] += 1

    async def measure(self, run: Callable[[], Awaitable[object]]) -> Counter[str]:
        loop = self._loop
        run_once, create_future = loop._run_once, loop.create_future
        counts = self.counts = Counter()

        def turn() -> None:
            counts["loop turns"] += 1
            run_once()

        def future() -> asyncio.Future[Any]:
            counts["futures"] += 1
            return create_future()  # type: ignore[no-any-return]

        def task(loop: Any, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            counts["tasks"] += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop._run_once, loop.create_future = turn, future
        loop.set_task_factory(task)
        sys.setprofile(self._profile)
        try:
            await run()
        finally:
            sys.setprofile(None)
            loop._run_once, loop.create_future = run_once, create_future
            loop.set_task_factory(None)
        return counts


def _count_calls(store: MemoryStore, counting: _Counting) -> MemoryStore:
    """``store`` with each call of its public methods counted as a ``store calls``."""

    def counted(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            counting.counts["store calls"] += 1
            return method(*args, **kwargs)

        return call

    for name, method in inspect.getmembers(store, inspect.ismethod):
        if not name.startswith("_"):
            setattr(store, name, counted(method))
    return store


async def _main(sessions: int, events: int) -> None:
    ids = Ids()
    counting = _Counting(asyncio.get_running_loop())
    store = _count_calls(MemoryStore(), counting)
    async with (
        await create_server(leaf, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):

        async def session(n: int = 0) -> None:
            session_id = ids("count")
            mode = "emit" if n else "once"
            await client.start(leaf_input(mode=mode, n=n), session_id=session_id)
            async for _ in client.stream(session_id):
                pass

        async def calls() -> None:
            for _ in range(sessions):
                await session()

        await session()
        await session(10)  # warm: imports, caches
        per_call = await counting.measure(calls)
        stream = await counting.measure(lambda: session(events))
    print(f"per Start->completed (mean of {sessions}):")
    for key, value in sorted(per_call.items()):
        print(f"  {key:>16}: {value / sessions:10.1f}")
    print(f"per streamed event ({events:,} text deltas, minus one one-step session):")
    for key, value in sorted(stream.items()):
        print(f"  {key:>16}: {(value - per_call[key] / sessions) / events:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(_main(args.sessions, args.events))


if __name__ == "__main__":
    main()
