"""``ListSessions`` over real gRPC on 127.0.0.1, against every store backend: order,
paging, filters, what a summary holds, and INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from helix_transport import AgentClient, ClientConfig, InvalidArgument, SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.server._listing import reported_at_or_after
from helix_transport.store import Store
from helix_transport.testing.store_suite import make_record
from tests.agents import counter, looper
from tests.conftest import Serve


async def _finished(client: AgentClient, session_id: str, **fields: object) -> None:
    await client.start(json.dumps({"steps": 1, "words": 1}), session_id=session_id, **fields)  # type: ignore[arg-type]
    await client.wait(session_id)


async def test_sessions_are_listed_newest_first_with_what_get_status_says(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        for session_id in ("s-first", "s-second", "s-third"):
            await _finished(client, session_id)
        page = await client.list_sessions()
        assert [s.session_id for s in page.sessions] == ["s-third", "s-second", "s-first"]
        assert page.next_page_token == ""
        for summary in page.sessions:
            status = await client.get_status(summary.session_id)
            assert summary.agent_type == status.agent_type == "counter"
            assert summary.status == status.status == pb.SESSION_STATUS_COMPLETED
            assert summary.last_sequence == status.last_sequence > 0
            assert summary.created_at == status.created_at
            assert summary.updated_at == status.updated_at
            assert summary.finished_at == status.finished_at
            assert summary.parent_session_id == ""


async def test_pages_follow_each_other_and_new_sessions_do_not_shift_them(
    serve: Serve,
) -> None:
    async with serve(counter) as (_, client):
        for n in range(7):
            await _finished(client, f"s-{n}")
        first = await client.list_sessions(page_size=3)
        assert [s.session_id for s in first.sessions] == ["s-6", "s-5", "s-4"]
        await _finished(client, "s-new")  # newer than every page: on none of them
        rest = []
        token = first.next_page_token
        while token:
            page = await client.list_sessions(page_size=3, page_token=token)
            rest += [s.session_id for s in page.sessions]
            token = page.next_page_token
        assert rest == ["s-3", "s-2", "s-1", "s-0"]
        listed = [s.session_id async for s in client.iter_sessions(page_size=2)]
        assert listed == ["s-new", *(f"s-{n}" for n in reversed(range(7)))]
        assert [s.session_id async for s in client.iter_sessions(limit=3)] == [
            "s-new",
            "s-6",
            "s-5",
        ]


async def test_filters(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await _finished(client, "s-root")
        await _finished(client, "s-child", parent_session_id="s-root")
        middle = datetime.now(UTC)
        await _finished(client, "s-late")

        async def ids(**filters: object) -> list[str]:
            return [s.session_id async for s in client.iter_sessions(**filters)]  # type: ignore[arg-type]

        assert await ids(roots_only=True) == ["s-late", "s-root"]
        assert await ids(created_after=middle) == ["s-late"]
        assert await ids(created_before=middle) == ["s-child", "s-root"]
        assert await ids(statuses=[SessionStatus.COMPLETED]) == ["s-late", "s-child", "s-root"]
        assert await ids(statuses=[SessionStatus.RUNNING, SessionStatus.FAILED]) == []
        assert await ids(agent_type="counter", page_size=1) == ["s-late", "s-child", "s-root"]
        # A type this service does not host: it would find none of them by GetStatus.
        assert await ids(agent_type="looper") == []


async def test_a_shared_store_lists_only_this_services_agent_type(serve: Serve) -> None:
    async with serve(counter) as (_, counters), serve(looper) as (_, loopers):
        await _finished(counters, "s-count")
        await loopers.start(json.dumps({"steps": 1}), session_id="s-loop")
        await loopers.wait("s-loop")
        assert [s.session_id async for s in counters.iter_sessions()] == ["s-count"]
        looped = [s async for s in loopers.iter_sessions()]
        assert [(s.session_id, s.status) for s in looped] == [("s-loop", pb.SESSION_STATUS_FAILED)]


async def test_a_large_page_size_is_served_as_the_maximum(serve: Serve, store: Store) -> None:
    # Straight into the store, and finished: 505 runs (the server resumes a RUNNING
    # session it finds at start) would only slow the test.
    for n in range(505):
        await store.create_session(
            make_record(
                f"s-{n:03}",
                agent_type="counter",
                principal="anonymous",
                created_at=float(n),
                status=SessionStatus.COMPLETED,
                finished_at=float(n) + 0.5,
            )
        )
    patient = ClientConfig(rpc_timeout=timedelta(seconds=60))  # 500 at once, on a busy machine
    async with (
        serve(counter) as (server, _),
        await AgentClient.connect(server.address, config=patient) as client,
    ):
        page = await client.list_sessions(page_size=100_000)
        assert len(page.sessions) == 500 and page.sessions[0].session_id == "s-504"
        rest = await client.list_sessions(page_size=100_000, page_token=page.next_page_token)
        assert [s.session_id for s in rest.sessions] == [f"s-{n:03}" for n in range(4, -1, -1)]
        assert rest.next_page_token == ""
        assert len((await client.list_sessions()).sessions) == 50  # the default


BAD_REQUESTS = [
    ({"page_size": -1}, "page_size"),
    ({"page_token": "bm90IGEgdG9rZW4"}, "page_token"),
    ({"page_token": "%%%"}, "page_token"),
    ({"page_token": "x" * 5000}, "page_token"),
    ({"statuses": [pb.SESSION_STATUS_UNSPECIFIED]}, "statuses[0]"),
    ({"statuses": [pb.SESSION_STATUS_RUNNING, 42]}, "statuses[1]"),
    ({"agent_type": "Not A Type"}, "agent_type"),
    ({"agent_type": "looper", "page_token": "forged"}, "page_token"),
]


async def test_bad_requests_name_the_field(serve: Serve) -> None:
    async with (
        serve(counter) as (server, _),
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        for fields, field in BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListSessions(pb.ListSessionsRequest(**fields), timeout=30)  # type: ignore[arg-type]
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
            assert (caught.value.details() or "").startswith(f"{field}: "), fields


async def test_pages_continue_on_another_replica(serve: Serve) -> None:
    async with serve(counter) as (_, first), serve(counter) as (_, second):
        for n in range(5):
            await _finished(first if n % 2 else second, f"s-{n}")
        page = await first.list_sessions(page_size=2)
        rest = await second.list_sessions(page_size=10, page_token=page.next_page_token)
        assert [s.session_id for s in (*page.sessions, *rest.sessions)] == [
            "s-4",
            "s-3",
            "s-2",
            "s-1",
            "s-0",
        ]


async def test_bad_timestamps_and_tokens_of_other_filters_are_refused(serve: Serve) -> None:
    async with serve(counter) as (server, client):
        for n in range(3):
            await _finished(client, f"s-{n}")
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            for name in ("created_after", "created_before"):
                request = pb.ListSessionsRequest()
                getattr(request, name).nanos = -1
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ListSessions(request, timeout=30)
                assert (caught.value.details() or "").startswith(f"{name}: ")
        token = (await client.list_sessions(page_size=1)).next_page_token
        assert token
        with pytest.raises(InvalidArgument) as refused:
            await client.list_sessions(page_size=1, page_token=token, roots_only=True)
        assert refused.value.field == "page_token"
        # The page size may change from page to page; the filters may not.
        page = await client.list_sessions(page_size=5, page_token=token)
        assert [s.session_id for s in page.sessions] == ["s-1", "s-0"]
        hour = timedelta(hours=1)
        late = await client.list_sessions(created_after=datetime.now(UTC) + hour)
        assert list(late.sessions) == []


@pytest.mark.parametrize("seed", range(3))
def test_time_bounds_compare_as_the_reported_times(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        stored = rng.uniform(1.6e9, 1.9e9)
        reported = int(stored * 1e9)  # what GetStatus and ListSessions send
        bound = reported_at_or_after(reported)
        assert stored >= bound  # created_after its own created_at: listed
        assert int(bound * 1e9) >= reported
        assert int(math.nextafter(bound, -math.inf) * 1e9) < reported  # the smallest such
