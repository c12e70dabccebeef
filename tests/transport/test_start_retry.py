"""A Start that times out or is cancelled (a queued, overloaded service) is retried, and
runs its session once.

The client names every session it starts, so a retry of a Start whose first attempt
did create the session gets that session back (``created=false``) rather than a second
run. Real gRPC on 127.0.0.1; the store makes the first attempt slow.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from grpc.aio import ClientCallDetails

from helix_transport import AgentClient, ClientConfig, DeadlineExceeded, RetryConfig
from helix_transport.server import create_server
from helix_transport.store._records import SessionRecord
from helix_transport.store.memory import MemoryStore
from tests.agents import counter

ATTEMPT = ClientConfig(rpc_timeout=timedelta(seconds=0.3))
"""Each attempt gives up after 0.3 s; the reconnect deadline (30 s) bounds the retries."""


class SlowFirstCreate(MemoryStore):
    """The first ``create_session`` takes 1 s, before or after it creates the session."""

    def __init__(self, *, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.creates = 0

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        self.creates += 1
        first = self.creates == 1
        if first and self.slow == "before":
            await asyncio.sleep(1.0)
        result = await super().create_session(record, lease_ttl_s=lease_ttl_s)
        if first and self.slow == "after":
            await asyncio.sleep(1.0)  # the session exists; its reply is what is late
        return result


@pytest.mark.parametrize("slow", ["before", "after"])
async def test_a_timed_out_start_is_retried_and_runs_the_session_once(slow: str) -> None:
    store = SlowFirstCreate(slow=slow)
    async with (
        await create_server(counter, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address, config=ATTEMPT) as client,
    ):
        reply = await client.start(json.dumps({"steps": 2, "words": 2}), session_id="s")
        events = [event async for event in client.stream("s")]
        await asyncio.sleep(1.0)  # the first attempt's create has returned by now
        status = await client.get_status("s")
    assert store.creates >= 2  # the first attempt timed out, and was retried
    # "before": the retry created it while the first attempt slept; "after": the first
    # attempt created it and the retry got it back.
    assert reply.created is (slow == "before")
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds.count("run_started") == 1 and kinds[-1] == "completed"
    assert [event.sequence for event in events] == list(range(1, len(events) + 1))
    assert status.last_sequence == len(events)


async def test_a_start_that_keeps_timing_out_fails_after_the_reconnect_deadline() -> None:
    impatient = ClientConfig(
        rpc_timeout=timedelta(seconds=0.3), reconnect=RetryConfig(deadline=timedelta(0))
    )
    store = SlowFirstCreate(slow="before")
    async with (
        await create_server(counter, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address, config=impatient) as client,
    ):
        with pytest.raises(DeadlineExceeded) as timed_out:
            await client.start(json.dumps({"steps": 1}), session_id="s")
        assert store.creates == 1  # no retry: the deadline had passed
        assert timed_out.value.retryable
        # The late first attempt still created and ran the session: a later Start of the
        # same id joins it.
        await asyncio.sleep(1.0)
        again = await client.start(json.dumps({"steps": 1}), session_id="s")
        events = [event async for event in client.stream("s")]
    assert not again.created
    assert events[-1].WhichOneof("payload") == "completed"


class CancelFirstStart(grpc.aio.UnaryUnaryClientInterceptor):
    """The first ``Start`` reaches the service (the session is created), and then ends
    CANCELLED, as a server that held it in its queue past its deadline ends it."""

    def __init__(self) -> None:
        self.starts = 0

    async def intercept_unary_unary(
        self,
        continuation: Callable[[ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: ClientCallDetails,
        request: Any,
    ) -> Any:
        call = await continuation(client_call_details, request)
        method = client_call_details.method
        if not (method.decode() if isinstance(method, bytes) else method).endswith("/Start"):
            return call
        self.starts += 1
        if self.starts > 1:
            return call
        await call  # the session exists now
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.CANCELLED,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="CANCELLED",
        )


async def test_a_start_the_server_cancelled_is_retried_and_runs_the_session_once() -> None:
    cancel = CancelFirstStart()
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address, interceptors=[cancel]) as client,
    ):
        reply = await client.start(json.dumps({"steps": 1}), session_id="s")
        events = [event async for event in client.stream("s")]
    assert cancel.starts == 2  # cancelled once, retried once
    assert not reply.created  # the first attempt had created it
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds.count("run_started") == 1 and kinds[-1] == "completed"
