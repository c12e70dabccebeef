"""Metrics in one process: the store wrapper is transparent and times every call, a
label never takes a value the model chose, and with metrics off nothing is wrapped.

Metrics are process-wide: the ``recorded`` fixture installs an in-memory reader for
one test and puts the no-op instruments back after it.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from pydantic import BaseModel

from helix_transport import Agent, AgentClient, create_server
from helix_transport._exceptions import SessionNotFound, UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.scripted import ScriptedTurn, call, finish, register_script, tool_results
from helix_transport.config import Environment
from helix_transport.metrics import MetricsConfig, metered_store, metrics_enabled, start_metrics
from helix_transport.metrics.instruments import install
from helix_transport.metrics.store import MeteredStore
from helix_transport.store import (
    InputStore,
    Interrupt,
    MemoryStore,
    SessionUpdate,
    SqliteStore,
    Store,
)
from helix_transport.testing.store_suite import StoreConformance, make_record


@pytest.fixture
def recorded() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    install(provider.get_meter("test"))
    try:
        yield reader
    finally:
        install(None)
        provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    """The data points of the metric ``name`` collected so far."""
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


class TestMeteredSqliteStore(StoreConformance):
    """The wrapped store passes the whole conformance suite: timing changes nothing."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        backend = await SqliteStore.open(str(tmp_path / "metered.db"))
        store = metered_store(backend)
        assert isinstance(store, MeteredStore) and store.wrapped is backend
        yield store
        await store.aclose()


async def test_every_store_call_is_timed_by_backend_and_operation(
    recorded: InMemoryMetricReader,
) -> None:
    store = metered_store(MemoryStore())
    record = make_record()
    await store.create_session(record)
    assert await store.get_session(record.session_id) is not None
    with pytest.raises(SessionNotFound):
        await store.update_session("nobody", SessionUpdate(step_count=1))
    timed = {
        tuple(sorted(p.attributes.items())): p.count
        for p in points(recorded, "helix.store.operation.duration")
    }
    memory = ("helix.store.backend", "memory")
    assert timed == {
        (memory, ("helix.store.operation", "create_session")): 1,
        (memory, ("helix.store.operation", "get_session")): 1,
        (
            ("error.type", "SessionNotFound"),
            memory,
            ("helix.store.operation", "update_session"),
        ): 1,
    }
    await store.aclose()


async def test_input_calls_are_timed_and_pass_their_keywords(
    recorded: InMemoryMetricReader,
) -> None:
    # Wrapped at the seam, people's input is timed like any store call, and an
    # abort keeps its keyword on the way through.
    store = metered_store(MemoryStore())
    assert isinstance(store, InputStore)
    assert await store.put_answer("s-1", "call-1", "{}") == ("{}", True)
    assert await store.list_answers("s-1") == {"call-1": "{}"}
    await store.set_interrupt("s-1", "abort", abort=True)
    assert await store.take_interrupt("s-1") == Interrupt("abort", abort=True)
    operations = {
        dict(p.attributes)["helix.store.operation"]: p.count
        for p in points(recorded, "helix.store.operation.duration")
    }
    assert operations == {
        "put_answer": 1,
        "list_answers": 1,
        "set_interrupt": 1,
        "take_interrupt": 1,
    }
    await store.aclose()


class _Question(BaseModel):
    text: str


class _Answer(BaseModel):
    answer: str


def _invents_a_tool(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if not tool_results(messages):
        return ScriptedTurn(tool_calls=(call("made_up_by_the_model_9f3", q="x"),))
    return finish(answer="done")


inventor = Agent(
    name="inventor",
    description="Calls a tool it does not have, then answers.",
    input_model=_Question,
    output_model=_Answer,
    model=register_script("metrics-inventor", _invents_a_tool),
)


async def test_a_tool_the_model_made_up_is_labelled_unknown(
    recorded: InMemoryMetricReader,
) -> None:
    store = MemoryStore()
    async with await create_server(inventor, store, allow_unauthenticated=True) as server:
        assert server.store is not store  # wrapped, with metrics on
        async with await AgentClient.connect(server.address) as client:
            started = await client.start('{"text": "hi"}')
            status = await client.wait(started.session_id)
    assert status.status == pb.SessionStatus.SESSION_STATUS_COMPLETED
    tools = {
        tuple(sorted((p.attributes or {}).items())): p.count
        for p in points(recorded, "helix.tool.duration")
        if isinstance(p, HistogramDataPoint)
    }
    assert tools == {
        (("error.type", "tool_error"), ("gen_ai.tool.name", "unknown")): 1,
        (("gen_ai.tool.name", "__finish__"),): 1,
    }


async def test_with_metrics_off_nothing_is_wrapped() -> None:
    assert not metrics_enabled()
    store = MemoryStore()
    async with await create_server(inventor, store, allow_unauthenticated=True) as server:
        assert server.store is store
        async with await AgentClient.connect(server.address) as client:
            started = await client.start('{"text": "hi"}')
            await client.wait(started.session_id)


def test_the_metrics_port_is_read_from_the_environment_and_checked() -> None:
    assert Environment({}).metrics_port() is None  # off by default
    assert Environment({"HELIX_METRICS_PORT": "9464"}).metrics_port() == 9464
    with pytest.raises(UsageError, match="HELIX_METRICS_PORT"):
        Environment({"HELIX_METRICS_PORT": "nine"}).metrics_port()
    with pytest.raises(UsageError, match="0-65535"):
        MetricsConfig(port=70000)


def test_a_busy_port_or_a_second_endpoint_is_a_usage_error() -> None:
    endpoint = start_metrics(MetricsConfig(port=0))
    try:
        assert metrics_enabled()
        with pytest.raises(UsageError, match="already"):
            start_metrics(MetricsConfig(port=0))
    finally:
        endpoint.shutdown()
    assert not metrics_enabled()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UsageError, match="cannot serve metrics"):
            start_metrics(MetricsConfig(port=taken.getsockname()[1]))
    assert not metrics_enabled()
