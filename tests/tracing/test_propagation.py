"""W3C trace context across processes: SERVER and CLIENT spans, link or parent.

Three example services (orchestrator -> researcher, summarizer), each a process
exporting OTLP/HTTP to a local receiver, and a client that traces with the
OpenTelemetry SDK of its own (a gateway) and sends its ``traceparent``:

- by default the root session keeps its own trace (keyed on its id) and the caller's
  span is a link, on the Start's SERVER span and on the root run;
- with ``join_trace=True`` the session's whole tree lands in the caller's trace,
  its root run under the caller's span;
- every RPC has its SERVER span, every call a service makes to a child its CLIENT
  span, the child's SERVER span under it; generations carry the ``gen_ai.*``
  attributes, usage only on generations (summed once); no span is exported twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from helix_transport import AgentClient
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from helix_transport.tracing.ids import trace_id_for
from tests.helpers import ROOT
from tests.tracing.otlp_receiver import OtlpReceiver, ReceivedSpan

QUESTION = json.dumps({"question": "How does a mesh keep one trace across its services?"})
SERVICES = ("researcher", "summarizer", "orchestrator")
RPC = "helix.agent.v1.AgentService/"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture
async def mesh(
    tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[str, ServiceProcess]]:
    for name in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "HELIX_LOG_LEVEL": "WARNING",
    }
    services = {
        name: ServiceProcess(
            f"services.{name}:agent",
            port=free_port(),
            store_url=f"sqlite:///{tmp_path / (name + '.db')}",
            log_path=tmp_path / f"{name}.log",
            env=dict(env),
            cwd=ROOT,
        )
        for name in SERVICES
    }
    for name in ("researcher", "summarizer"):
        services["orchestrator"].env[address_env_var(name)] = services[name].address
    await asyncio.gather(*(s.start() for s in services.values()))
    try:
        yield services
    finally:
        await asyncio.gather(*(s.stop() for s in services.values()))


def _gateway() -> tuple[TracerProvider, InMemorySpanExporter]:
    """The caller's own tracing: an SDK provider of its own, nothing global."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def _ask(address: str, session_id: str, *, join_trace: bool) -> None:
    async with await AgentClient.connect(address, join_trace=join_trace) as client:
        await client.start(QUESTION, session_id=session_id)
        events = [e async for e in client.stream(session_id)]
    assert events[-1].WhichOneof("payload") == "completed"


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


async def test_spans_join_across_three_services_and_a_tracing_client(
    mesh: dict[str, ServiceProcess], receiver: OtlpReceiver
) -> None:
    provider, exporter = _gateway()
    tracer = provider.get_tracer("gateway")
    with tracer.start_as_current_span("gateway linked"):
        await _ask(mesh["orchestrator"].address, "linked-1", join_trace=False)
    with tracer.start_as_current_span("gateway joined"):
        await _ask(mesh["orchestrator"].address, "joined-1", join_trace=True)
    async with await AgentClient.connect(mesh["orchestrator"].address) as client:
        rolled = await client.get_status("linked-1", include_children=True)
    codes = await asyncio.gather(*(s.stop() for s in mesh.values()))
    assert codes == [0, 0, 0]  # SIGTERM: each flushed its spans on the way out

    gateway: dict[str, ReadableSpan] = {s.name: s for s in exporter.get_finished_spans()}
    spans = receiver.snapshot()
    ids = [(s.trace_id, s.span_id) for s in spans]
    assert len(ids) == len(set(ids)), "a span was exported twice"

    linked_trace = _hex(trace_id_for("linked-1"), 32)
    caller = gateway["gateway linked"].get_span_context()
    joined = gateway["gateway joined"].get_span_context()
    assert caller is not None and joined is not None
    # Two traces: the linked session's own, and the joining caller's.
    assert {s.trace_id for s in spans} == {linked_trace, _hex(joined.trace_id, 32)}
    linked = [s for s in spans if s.trace_id == linked_trace]
    tree = [s for s in spans if s.trace_id == _hex(joined.trace_id, 32)]

    _check_link(linked, (_hex(caller.trace_id, 32), _hex(caller.span_id, 16)))
    _check_parent(tree, _hex(joined.span_id, 16))
    for trace in (linked, tree):
        _check_rpc_kinds(trace)
        _check_generations(trace)
    # Usage once: the generations' tokens add up to what the session and its children
    # used, as GetStatus totals them (runs carry helix.usage.*, not gen_ai.usage.*).
    assert all(
        "gen_ai.usage.input_tokens" not in s.attributes
        for s in linked
        if s.attributes.get("langfuse.observation.type") != "generation"
    )
    generations = [
        s for s in linked if s.attributes.get("langfuse.observation.type") == "generation"
    ]
    assert sum(g.attributes["gen_ai.usage.input_tokens"] for g in generations) == (
        rolled.total_usage.prompt_tokens
    )
    assert sum(g.attributes["gen_ai.usage.output_tokens"] for g in generations) == (
        rolled.total_usage.completion_tokens
    )
    provider.shutdown()


def _runs(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith("invoke_agent ")]


def _check_link(spans: list[ReceivedSpan], caller: tuple[str, str]) -> None:
    """The caller's span is a link of the root run and of the Start's SERVER span."""
    (start,) = [
        s
        for s in spans
        if s.name == RPC + "Start" and s.service_name == "orchestrator" and s.kind == "SERVER"
    ]
    assert start.kind == "SERVER" and start.parent_span_id == ""
    assert start.links == (caller,)
    (root,) = [r for r in _runs(spans) if r.service_name == "orchestrator"]
    assert root.parent_span_id == "" and root.links == (caller,)
    assert root.attributes["helix.session_id"] == "linked-1"


def _check_parent(spans: list[ReceivedSpan], caller_span_id: str) -> None:
    """The joined root run nests under the caller's span; no span links anywhere."""
    (root,) = [r for r in _runs(spans) if r.service_name == "orchestrator"]
    assert root.parent_span_id == caller_span_id and root.links == ()
    assert root.attributes["helix.session_id"] == "joined-1"
    assert "langfuse.trace.name" not in root.attributes  # the caller's trace: not renamed
    (start,) = [
        s
        for s in spans
        if s.name == RPC + "Start" and s.service_name == "orchestrator" and s.kind == "SERVER"
    ]
    assert start.parent_span_id == caller_span_id
    children = [r for r in _runs(spans) if r.service_name != "orchestrator"]
    assert {r.service_name for r in children} == {"researcher", "summarizer"}


def _check_rpc_kinds(spans: list[ReceivedSpan]) -> None:
    """Each call between services: a CLIENT span in the orchestrator, the child's
    SERVER span under it; each child run under its delegation span."""
    by_id = {s.span_id: s for s in spans}
    clients = [s for s in spans if s.kind == "CLIENT"]
    servers = [s for s in spans if s.kind == "SERVER"]
    assert {s.service_name for s in clients} == {"orchestrator"}
    # The children's events come over one shared Follow call per service: no span.
    assert RPC + "Start" in {c.name for c in clients}
    between = [*clients, *(s for s in servers if s.service_name != "orchestrator")]
    assert not {RPC + "Stream", RPC + "Follow"} & {s.name for s in between}
    for client in clients:
        assert by_id[client.parent_span_id].service_name == "orchestrator"
        (served,) = [s for s in servers if s.parent_span_id == client.span_id]
        assert served.name == client.name
        assert served.service_name in ("researcher", "summarizer")
        assert served.attributes["rpc.grpc.status_code"] == 0
        assert client.attributes["rpc.grpc.status_code"] == 0
    # Every SERVER span in a child service answers one of those calls.
    in_children = [s for s in servers if s.service_name != "orchestrator"]
    assert {s.parent_span_id for s in in_children} <= {c.span_id for c in clients}
    assert len(in_children) == len(clients)
    for run in _runs(spans):
        if run.service_name != "orchestrator":
            assert by_id[run.parent_span_id].name.startswith("delegate ")


def _check_generations(spans: list[ReceivedSpan]) -> None:
    generations = [
        s for s in spans if s.attributes.get("langfuse.observation.type") == "generation"
    ]
    assert {g.service_name for g in generations} == set(SERVICES)
    for generation in generations:
        attributes = generation.attributes
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["gen_ai.request.model"].startswith("scripted/")
        assert (
            attributes["gen_ai.response.model"]
            == attributes["gen_ai.request.model"].split("/", 1)[1]
        )
        assert attributes["gen_ai.response.finish_reasons"] in (["stop"], ["tool_calls"])
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.cost"] == 0.0  # litellm's map: scripted is free


def test_a_joined_root_s_resumed_run_stays_under_the_caller_s_span() -> None:
    # What a joined Start recorded with the session is all a resumed run (another
    # process, no RPC in sight) has: it must land under the caller's span again.
    from helix_transport._events import SessionStatus
    from helix_transport.store import SessionRecord, Usage
    from helix_transport.tracing.otel import SpanHooks, make_provider

    exporter = InMemorySpanExporter()
    provider = make_provider("counter")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    caller_trace, caller_span = 0x1234, 0x5678
    traceparent = f"00-{caller_trace:032x}-{caller_span:016x}-01"
    for metadata in (
        {"traceparent": traceparent, "helix.trace": "parent"},
        {"traceparent": traceparent},  # not asked for: ignored, the session's own trace
    ):
        record = SessionRecord(
            session_id="root-1",
            agent_type="counter",
            input_json="{}",
            input_hash="",
            metadata=metadata,
        )
        hooks = SpanHooks(provider.get_tracer("test"), agent_type="counter", record=record)
        hooks.on_run_start(resumed=True, step=3)
        hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")
    joined, own = exporter.get_finished_spans()
    assert joined.context is not None and joined.parent is not None
    assert (joined.context.trace_id, joined.parent.span_id) == (caller_trace, caller_span)
    assert joined.attributes is not None and joined.attributes["langfuse.session.id"] == "root-1"
    assert own.context is not None and own.parent is None
    assert own.context.trace_id == trace_id_for("root-1")
    provider.shutdown()
