"""Tracing: run hooks, OpenTelemetry spans, Langfuse over OTLP/HTTP, token roll-up.

Unit level: the hooks of a run fire in order, a raising hook changes nothing, and
no configuration means no tracer at all. Process level: the three example
services (orchestrator -> researcher x N, summarizer), each in its own process
with its own SQLite store, export through the real Langfuse SDK to a local
OTLP/HTTP receiver; one delegation tree is one trace, keyed on the root session
id, also across a SIGKILL of the orchestrator and its resume.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import guarded
from helix_transport.agent.model import ModelResponse
from helix_transport.agent.tools import child_scope
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore, SessionRecord, Usage
from helix_transport.tracing import NO_HOOKS, RunHooks, setup_tracing
from helix_transport.tracing.ids import trace_id_for
from tests.agents import counter
from tests.helpers import ROOT, BlinkingStore, ServiceProcess, free_port
from tests.tracing.otlp_receiver import OtlpReceiver, ReceivedSpan

TRACING_ENV = (
    "LANGFUSE_PUBLIC_KEY",
    "LANGFUSE_SECRET_KEY",
    "LANGFUSE_HOST",
    "LANGFUSE_BASE_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@pytest.fixture(autouse=True)
def _no_tracing_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRACING_ENV:
        monkeypatch.delenv(name, raising=False)


# --- Unit level ----------------------------------------------------------------------


class Recorder:
    """Records every hook call as (name, details)."""

    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        self.calls.append(("run_start", (resumed, step)))

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        self.calls.append(("run_end", (status, usage.total_tokens > 0)))

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        self.calls.append(("generation_start", len(messages)))

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        assert output is not None and latency_s >= 0
        self.calls.append(("generation_end", output.usage.total_tokens > 0))

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        self.calls.append(("tool_start", name))

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        self.calls.append(("tool_end", (name, is_error)))

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        self.calls.append(("delegation_start", agent_type))
        return {}

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        self.calls.append(("delegation_end", status))


class Raising(Recorder):
    """Records, then raises from every hook."""

    def __getattribute__(self, name: str) -> Any:
        method = object.__getattribute__(self, name)
        if not name.startswith("on_"):
            return method

        def boom(**kwargs: Any) -> Any:
            method(**kwargs)
            raise RuntimeError(f"{name} is broken")

        return boom


async def _run_counter(hooks: RunHooks | None, steps: int = 2) -> tuple[str, int]:
    def factory(agent: Agent, record: SessionRecord) -> RunHooks:
        assert hooks is not None
        return hooks

    server = await create_server(
        counter, MemoryStore(), hooks=factory if hooks else None, allow_unauthenticated=True
    )
    async with server, await AgentClient.connect(server.address) as client:
        await client.start(json.dumps({"steps": steps, "words": 2}), session_id="s1")
        events = [e async for e in client.stream("s1")]
        status = await client.get_status("s1")
    assert events[-1].WhichOneof("payload") == "completed"
    return events[-1].completed.output_json, status.usage.total_tokens


def _expected_calls(steps: int) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = [("run_start", (False, 1))]
    for step in range(steps + 1):
        tool = "tick" if step < steps else "__finish__"
        calls += [
            ("generation_start", None),
            ("generation_end", True),
            ("tool_start", tool),
            ("tool_end", (tool, False)),
        ]
    return [*calls, ("run_end", (SessionStatus.COMPLETED, True))]


async def test_hooks_fire_in_order_for_a_run() -> None:
    calls: list[tuple[str, Any]] = []
    # Recorder is a hook from before on_turn_start: RunHooks without it, on purpose.
    await _run_counter(Recorder(calls), steps=2)  # type: ignore[arg-type]
    names = [c[0] for c in calls]
    assert names == [c[0] for c in _expected_calls(2)]
    assert calls[0] == ("run_start", (False, 1))
    assert calls[-1] == ("run_end", (SessionStatus.COMPLETED, True))
    assert [c[1] for c in calls if c[0] == "tool_start"] == ["tick", "tick", "__finish__"]
    assert all(ok for name, ok in calls if name == "generation_end")


async def test_a_raising_hook_does_not_change_the_run() -> None:
    calls: list[tuple[str, Any]] = []
    broken = await _run_counter(Raising(calls), steps=2)
    plain = await _run_counter(None, steps=2)
    assert broken == plain
    assert [c[0] for c in calls] == [c[0] for c in _expected_calls(2)]  # every hook still ran


def test_a_hook_without_on_turn_start_is_not_asked_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # on_turn_start came later: hooks written before it must go on working, unwarned.
    calls: list[tuple[str, Any]] = []
    hook = guarded(Recorder(calls))  # type: ignore[arg-type]  # lacks on_turn_start on purpose
    hook.on_turn_start(turn=2, message="again", fresh=False)
    assert calls == [] and "failed" not in caplog.text


def test_no_configuration_means_no_tracer() -> None:
    assert setup_tracing("counter") is None
    # In a fresh interpreter: serving code never even imports the OpenTelemetry SDK path.
    code = (
        "import sys, helix_transport.server.app as app\n"
        "from helix_transport.tracing import setup_tracing\n"
        "assert setup_tracing('counter') is None\n"
        "assert 'helix_transport.tracing.otel' not in sys.modules\n"
        "assert 'opentelemetry.sdk.trace' not in sys.modules, 'OTel SDK loaded'\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in TRACING_ENV}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)


async def test_the_runner_uses_the_free_no_op_hooks_without_tracing() -> None:
    server = await create_server(counter, MemoryStore(), allow_unauthenticated=True)
    record = SessionRecord(session_id="x", agent_type="counter", input_json="{}", input_hash="")
    assert server.runner._hooks_for(record) is NO_HOOKS


def test_a_root_session_is_its_own_root_whatever_its_metadata_says() -> None:
    # A caller naming another session as its root (or sending that trace's traceparent)
    # put its run in that trace and Langfuse session: another tenant's, possibly.
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from helix_transport.tracing.otel import SpanHooks, make_provider

    exporter = InMemorySpanExporter()
    provider = make_provider("counter")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    victim = trace_id_for("alice-1")
    spoofed = {
        "helix.root_session_id": "alice-1",
        "traceparent": f"00-{victim:032x}-{0xABCDEF:016x}-01",
    }
    for session_id, parent in (("carol-1", ""), ("alice-1-remote-c1", "alice-1")):
        record = SessionRecord(
            session_id=session_id,
            agent_type="counter",
            input_json="{}",
            input_hash="",
            parent_session_id=parent,
            metadata=spoofed,
        )
        hooks = SpanHooks(tracer, agent_type="counter", record=record)
        hooks.on_run_start(resumed=False, step=1)
        hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")
    root, child = exporter.get_finished_spans()
    assert root.context is not None and child.context is not None
    assert root.context.trace_id == trace_id_for("carol-1") != victim
    assert root.attributes is not None and root.attributes["langfuse.session.id"] == "carol-1"
    assert root.parent is None
    # A child (it names its parent) goes on inheriting its trace, as delegation needs.
    assert child.context.trace_id == victim
    assert child.attributes is not None and child.attributes["langfuse.session.id"] == "alice-1"
    provider.shutdown()


def test_a_parent_stopped_and_resumed_mid_delegation_exports_its_span_once() -> None:
    # A drain (or a lost lease) ended the open delegation span "run stopped"; the resumed
    # run opened it again with the same (deterministic) id: one span id, exported twice.
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from helix_transport.tracing.otel import SpanHooks, make_provider

    exporter = InMemorySpanExporter()
    provider = make_provider("orchestrator")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    record = SessionRecord(
        session_id="p1", agent_type="orchestrator", input_json="{}", input_hash=""
    )
    for status in (SessionStatus.RUNNING, SessionStatus.COMPLETED):  # stopped, then resumed
        hooks = SpanHooks(provider.get_tracer("test"), agent_type="orchestrator", record=record)
        hooks.on_run_start(resumed=status is SessionStatus.COMPLETED, step=1)
        hooks.on_tool_start(name="research", tool_call_id="call_1_0", arguments_json="{}")
        hooks.on_delegation_start(
            tool_call_id="call_1_0", child_session_id="p1-remote-call_1_0", agent_type="researcher"
        )
        if status is SessionStatus.COMPLETED:
            hooks.on_delegation_end(
                tool_call_id="call_1_0",
                child_session_id="p1-remote-call_1_0",
                status=SessionStatus.COMPLETED,
                error="",
            )
            hooks.on_tool_end(
                name="research", tool_call_id="call_1_0", result_json="{}", is_error=False
            )
        hooks.on_run_end(status=status, usage=Usage(), error="")
    spans = exporter.get_finished_spans()
    ids = [(s.context.trace_id, s.context.span_id) for s in spans if s.context is not None]
    assert len(ids) == len(set(ids)), [s.name for s in spans]
    (delegation,) = [s for s in spans if s.name == "delegate researcher"]
    assert delegation.attributes is not None
    assert delegation.attributes["helix.child_status"] == "completed"
    provider.shutdown()


class MemoryTracing:
    """A service's tracing (``OtelTracing``) into an in-memory exporter, for one process."""

    def __init__(self, service_name: str) -> None:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from helix_transport.tracing.otel import OtelTracing, make_provider

        self.exporter = InMemorySpanExporter()
        provider = make_provider(service_name)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = OtelTracing(provider)

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def close(self) -> None:
        self.tracing.shutdown()


async def test_a_continued_turns_run_span_shows_the_turns_message() -> None:
    # The run span's input was the session record's, so every turn showed the first one.
    from services.critic import agent as critic

    traced = MemoryTracing("critic")
    server = await create_server(
        critic, MemoryStore(), hooks=traced.tracing.hooks_for, allow_unauthenticated=True
    )
    first = json.dumps({"artifact": "a draft"})
    async with server, await AgentClient.connect(server.address) as client:
        await client.start(first, session_id="critic-1")
        assert [e async for e in client.stream("critic-1")][-1].WhichOneof("payload") == (
            "completed"
        )
        for turn, fresh, message in ((2, False, "now with tests"), (3, True, first)):
            reply = await client.continue_session("critic-1", message, turn=turn, fresh=fresh)
            events = [e async for e in client.stream("critic-1", from_sequence=reply.from_sequence)]
            assert events[-1].WhichOneof("payload") == "completed"
    runs = [s for s in traced.spans() if s.name == "invoke_agent critic"]
    assert [r.attributes["langfuse.observation.input"] for r in runs] == [
        first,
        "now with tests",
        first,
    ]
    assert [r.attributes.get("helix.turn") for r in runs] == [None, 2, 3]
    # The trace's input stays the session's first: the trace is the whole session.
    assert {r.attributes["langfuse.trace.input"] for r in runs} == {first}
    traced.close()


async def test_a_run_resumed_within_a_continued_turn_shows_the_turns_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    traced, store = MemoryTracing("counter"), BlinkingStore()
    server = await create_server(
        counter,
        store,
        ServerConfig(lease_ttl_s=1.0),
        hooks=traced.tracing.hooks_for,
        allow_unauthenticated=True,
    )
    first, second = json.dumps({"steps": 1, "words": 1}), json.dumps({"steps": 20, "words": 3})
    async with server, await AgentClient.connect(server.address) as client:
        await client.start(first, session_id="c2")
        await client.wait("c2")
        reply = await client.continue_session("c2", second, turn=2, fresh=True)
        async for event in client.stream("c2", from_sequence=reply.from_sequence):
            if event.WhichOneof("payload") == "step_started" and event.step >= 4:
                break  # turn 2 well under way: its run pauses and is resumed
        store.down = True
        await asyncio.sleep(0.3)
        store.down = False
        async with asyncio.timeout(30):
            assert (await client.wait("c2")).status == pb.SESSION_STATUS_COMPLETED
    runs = [s for s in traced.spans() if s.name == "invoke_agent counter"]
    resumed = [r for r in runs if r.attributes["helix.resumed"]]
    assert resumed and len(runs) == 2 + len(resumed)
    for run in resumed:
        assert run.attributes["helix.turn"] == 2
        assert run.attributes["langfuse.observation.input"] == second
    traced.close()


@asynccontextmanager
async def _traced_pair(
    parent: Agent, child: Agent, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AgentClient, MemoryTracing, MemoryTracing]]:
    """``parent``'s service and ``child``'s, in this process, each traced in memory."""
    traced = MemoryTracing(parent.name), MemoryTracing(child.name)
    async with (
        await create_server(
            child, MemoryStore(), hooks=traced[1].tracing.hooks_for, allow_unauthenticated=True
        ) as children,
    ):
        monkeypatch.setenv(address_env_var(child.name), children.address)
        async with (
            await create_server(
                parent, MemoryStore(), hooks=traced[0].tracing.hooks_for, allow_unauthenticated=True
            ) as server,
            await AgentClient.connect(server.address) as client,
        ):
            yield client, *traced
    for each in traced:
        each.close()


def _parent_of(span: Any, spans: list[Any]) -> Any:
    (parent,) = [s for s in spans if s.context.span_id == span.parent.span_id]
    return parent


def _unique_ids(spans: list[Any]) -> bool:
    ids = [(s.context.trace_id, s.context.span_id) for s in spans]
    return len(ids) == len(set(ids))


async def test_each_dispatched_task_runs_under_its_delegation_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # run_subagent's children were top-level spans of the trace: no delegate span.
    from services.researcher import agent as researcher
    from tests.agents.companions import coordinator

    topics = ["event sourcing", "grpc streaming"]
    async with _traced_pair(coordinator, researcher, monkeypatch) as (client, parent, child):
        await client.start(json.dumps({"topics": topics}), session_id="co")
        assert (await client.wait("co")).status == pb.SESSION_STATUS_COMPLETED
    spans = parent.spans() + child.spans()
    assert _unique_ids(spans)
    (root_run,) = [s for s in parent.spans() if s.name == "invoke_agent coordinator"]
    runs = [s for s in child.spans() if s.name == "invoke_agent researcher"]
    scope = child_scope("coordinator", "")
    assert sorted(r.attributes["helix.session_id"] for r in runs) == [
        f"co-task-call_1_0-0-{scope}",
        f"co-task-call_1_0-1-{scope}",
    ]
    for run in runs:
        delegation = _parent_of(run, spans)
        assert delegation.name == "delegate researcher"
        assert delegation.attributes["helix.child_session_id"] == run.attributes["helix.session_id"]
        assert delegation.attributes["helix.child_status"] == "completed"
        tool = _parent_of(delegation, spans)
        assert tool.name == "execute_tool run_subagent"
        assert _parent_of(tool, spans) is root_run
    assert len([s for s in spans if s.name.startswith("delegate ")]) == len(topics)


async def test_a_companion_s_turns_run_under_its_one_delegation_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Companion children were top-level spans of the trace, each turn's run alike.
    from services.critic import agent as critic
    from tests.agents.companions import maker

    drafts = ["a draft", "a draft with tests"]
    async with _traced_pair(maker, critic, monkeypatch) as (client, parent, child):
        await client.start(json.dumps({"drafts": drafts}), session_id="mk")
        assert (await client.wait("mk")).status == pb.SESSION_STATUS_COMPLETED
    spans = parent.spans() + child.spans()
    assert _unique_ids(spans)
    runs = [s for s in child.spans() if s.name == "invoke_agent critic"]
    assert [r.attributes.get("helix.turn") for r in runs] == [None, 2]
    (delegation,) = [s for s in spans if s.name.startswith("delegate ")]
    assert delegation.name == "delegate critic"
    reviewer = f"mk-agent-reviewer-{child_scope('maker', '')}"
    assert delegation.attributes["helix.child_session_id"] == reviewer
    assert delegation.attributes["helix.child_status"] == "completed"
    # The Start's span: the child keeps that trace context for every turn.
    assert all(_parent_of(run, spans) is delegation for run in runs)
    tool = _parent_of(delegation, spans)
    assert tool.name == "execute_tool companion__spawn_agent"
    assert tool.attributes["gen_ai.tool.call.id"] == delegation.attributes["gen_ai.tool.call.id"]


async def test_a_span_a_stopped_run_left_open_is_opened_again_and_exported_once() -> None:
    # The resume rules of helix_transport.delegation.spans, run by run, with real spans: a
    # span left open goes to the resumed run; one ended by a run that then stopped before
    # its checkpoint is not opened again (its ref says how the child ended); one of an
    # earlier turn neither (that turn's run cut it off).
    import copy

    from helix_transport.agent.state import joined_state, split_state
    from helix_transport.agent.tools import RunServices, ToolContext
    from helix_transport.delegation.spans import (
        end_delegation,
        open_delegation,
        reopen_delegations,
    )
    from helix_transport.store import SubSessionRef
    from helix_transport.tracing.otel import SpanHooks
    from helix_transport.transport._pool import ClientPool

    traced, store = MemoryTracing("coordinator"), MemoryStore()
    record = SessionRecord(
        session_id="p1", agent_type="coordinator", input_json="{}", input_hash=""
    )
    child = "p1-task-call_1_0-0"

    async def ref(status: SessionStatus) -> None:
        await store.put_subsession_ref(
            SubSessionRef(
                parent_session_id="p1",
                child_session_id=child,
                agent_type="researcher",
                tool_call_id="call_1_0-0",
                status=status,
                address="127.0.0.1:1",
            )
        )

    def run(stored: dict[str, Any], *, turn: int = 1) -> tuple[SpanHooks, ToolContext]:
        """A run resumed from a checkpoint whose ``state`` is ``stored``, in ``turn``."""
        state, run_state = split_state(stored)
        run_state.turns.turn = turn
        hooks = SpanHooks(traced.tracing.tracer, agent_type="coordinator", record=record)
        hooks.on_run_start(resumed=True, step=1)

        async def flush() -> None:
            pass

        ctx = ToolContext(
            session_id="p1",
            agent_type="coordinator",
            tool_call_id="call_1_0",
            step=1,
            metadata={},
            emit=lambda event: None,
            run=RunServices(
                flush=flush, store=store, clients=ClientPool(), hooks=hooks, state=run_state
            ),
            state=state,
        )
        return hooks, ctx

    def delegations() -> list[Any]:
        return [s for s in traced.spans() if s.name == "delegate researcher"]

    # Run 1 starts the task (its ref running) and is stopped: its span is not exported.
    hooks, ctx = run({})
    await ref(SessionStatus.RUNNING)
    assert "traceparent" in open_delegation(ctx, child_session_id=child, agent_type="researcher")
    checkpoint = copy.deepcopy(joined_state(ctx.state, ctx.run.state))
    hooks.on_run_end(status=SessionStatus.RUNNING, usage=Usage(), error="")
    assert delegations() == []
    # Run 2 opens it again at its first step (a re-run of the call too: the same span),
    # records the task's end and is stopped before its checkpoint.
    hooks, ctx = run(copy.deepcopy(checkpoint))
    await reopen_delegations(ctx)
    open_delegation(ctx, child_session_id=child, agent_type="researcher")
    await ref(SessionStatus.COMPLETED)
    end_delegation(ctx, child_session_id=child, status=SessionStatus.COMPLETED)
    hooks.on_run_end(status=SessionStatus.RUNNING, usage=Usage(), error="")
    assert len(delegations()) == 1
    # Run 3 resumes from the same checkpoint: the ref says the task ended, so the span
    # is not opened again, and recording the end once more exports nothing.
    hooks, ctx = run(copy.deepcopy(checkpoint))
    await reopen_delegations(ctx)
    end_delegation(ctx, child_session_id=child, status=SessionStatus.COMPLETED)
    hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")
    (delegation,) = delegations()
    assert delegation.attributes["helix.child_status"] == "completed"
    assert delegation.parent is not None  # under run 2's run span (its tool call is over)
    # A span of an earlier turn (cut off when that turn's run ended) stays closed.
    await ref(SessionStatus.RUNNING)
    hooks, ctx = run(copy.deepcopy(checkpoint), turn=2)
    await reopen_delegations(ctx)
    end_delegation(ctx, child_session_id=child, status=SessionStatus.COMPLETED)
    hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")
    assert len(delegations()) == 1 and _unique_ids(traced.spans())
    traced.close()


# --- Process level -------------------------------------------------------------------


@dataclass
class Mesh:
    services: dict[str, ServiceProcess]
    receiver: OtlpReceiver

    @property
    def orchestrator(self) -> ServiceProcess:
        return self.services["orchestrator"]

    async def stop(self) -> None:
        """SIGTERM every service: each flushes its exporter on the way out."""
        codes = await asyncio.gather(
            *(s.terminate() for s in self.services.values() if s.proc is not None)
        )
        assert all(code == 0 for code in codes), codes


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def _mesh(tmp_path: Path, receiver: OtlpReceiver, **extra_env: str) -> Mesh:
    env = {
        "LANGFUSE_PUBLIC_KEY": "pk-lf-test",
        "LANGFUSE_SECRET_KEY": "sk-lf-test",
        "LANGFUSE_HOST": receiver.url,
        "LANGFUSE_FLUSH_INTERVAL": "0.2",
        "HELIX_LOG_LEVEL": "WARNING",
        **extra_env,
    }
    services = {
        name: ServiceProcess(
            f"services.{name}:agent",
            port=free_port(),
            store_url=f"sqlite:///{tmp_path / (name + '.db')}",
            log_path=tmp_path / f"{name}.log",
            env=dict(env),
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )
        for name in ("researcher", "summarizer", "orchestrator")
    }
    for name in ("researcher", "summarizer"):
        services["orchestrator"].env[address_env_var(name)] = services[name].address
    return Mesh(services=services, receiver=receiver)


@pytest.fixture
async def mesh(tmp_path: Path, receiver: OtlpReceiver) -> AsyncIterator[Mesh]:
    mesh = _mesh(tmp_path, receiver, HELIX_SCRIPTED_DELAY_MS="5")
    await asyncio.gather(*(s.start() for s in mesh.services.values()))
    try:
        yield mesh
    finally:
        await asyncio.gather(*(s.stop() for s in mesh.services.values()))


QUESTION = json.dumps({"question": "How does a mesh resume a stream and why does it log events?"})


def _by_kind(spans: list[ReceivedSpan], kind: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get("langfuse.observation.type") == kind]


def _runs(spans: list[ReceivedSpan], service: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.service_name == service and s.name.startswith("invoke_agent")]


def _children(events: list[pb.StreamEvent]) -> dict[str, str]:
    """child session id -> agent type, from the parent's subagent_start events."""
    return {
        e.subagent_start.child_session_id: e.subagent_start.child_agent_type
        for e in events
        if e.WhichOneof("payload") == "subagent_start"
    }


def test_a_second_langfuse_set_up_in_one_process_says_it_exports_nothing_there(
    monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    # Langfuse's client is one per public key and process: the second provider silently
    # got no Langfuse exporter. It still gets none (see README), but says so.
    from helix_transport.tracing import otel

    monkeypatch.setattr(otel, "_langfuse_taken", False)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-one-per-process")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_HOST", receiver.url)
    first = setup_tracing("researcher")
    assert "already set up" not in caplog.text
    second = setup_tracing("summarizer")
    assert first is not None and second is not None
    assert "Langfuse is already set up in this process" in caplog.text
    first.shutdown()
    second.shutdown()


async def test_one_trace_for_a_delegation_tree_across_three_services(mesh: Mesh) -> None:
    root = "trace-root-1"
    async with await AgentClient.connect(mesh.orchestrator.address) as client:
        await client.start(QUESTION, session_id=root)
        events = [e async for e in client.stream(root)]
        assert events[-1].WhichOneof("payload") == "completed"
        own = await client.get_status(root)
        rolled = await client.get_status(root, include_children=True)
    children = _children(events)
    assert sorted(set(children.values())) == ["researcher", "summarizer"]
    assert len(children) >= 3  # at least two research calls and one summary

    # Token roll-up: own + each child's own usage, each asked of its own service.
    expected = own.usage.total_tokens
    for child_id, agent_type in children.items():
        async with await AgentClient.connect(mesh.services[agent_type].address) as child:
            status = await child.get_status(child_id)
            assert status.parent_session_id == root
            assert status.usage.total_tokens > 0
            expected += status.usage.total_tokens
    assert own.HasField("total_usage") is False
    assert rolled.usage == own.usage
    assert rolled.total_usage.total_tokens == expected > own.usage.total_tokens
    assert (
        rolled.total_usage.prompt_tokens + rolled.total_usage.completion_tokens
        == rolled.total_usage.total_tokens
    )

    await mesh.stop()  # SIGTERM: the exporters are flushed on shutdown
    spans = mesh.receiver.snapshot()

    # Langfuse's endpoint, with the SDK's basic auth.
    assert {s.path for s in spans} == {"/api/public/otel/v1/traces"}
    assert all(s.authorization.startswith("Basic ") for s in spans)
    # The test's own GetStatus of each child, asked of the child's service directly
    # (not through the tree), is in the trace of the session it names: one per child.
    tree_trace = f"{trace_id_for(root):032x}"
    direct = [s for s in spans if s.trace_id != tree_trace]
    assert sorted(s.trace_id for s in direct) == sorted(f"{trace_id_for(c):032x}" for c in children)
    assert {(s.kind, s.name) for s in direct} == {
        ("SERVER", "helix.agent.v1.AgentService/GetStatus")
    }
    # Everything else: one trace, whose id is a function of the root session id.
    spans = [s for s in spans if s.trace_id == tree_trace]
    assert {s.service_name for s in spans} == {"orchestrator", "researcher", "summarizer"}
    runs_and_below = [s for s in spans if s.kind == "INTERNAL"]  # RPC spans: their own keys
    assert {s.attributes["session.id"] for s in runs_and_below} == {root}
    assert {s.attributes["langfuse.session.id"] for s in runs_and_below} == {root}

    # Generations with usage, in every service.
    generations = _by_kind(spans, "generation")
    assert {g.service_name for g in generations} == {"orchestrator", "researcher", "summarizer"}
    for generation in generations:
        assert generation.attributes["gen_ai.request.model"]
        assert generation.attributes["gen_ai.usage.input_tokens"] > 0
        assert generation.attributes["gen_ai.usage.output_tokens"] > 0
        assert json.loads(generation.attributes["langfuse.observation.usage_details"])["total"] > 0

    # The root run is the trace's root; every child run nests under its delegation
    # span, itself under the orchestrator's tool call.
    by_id = {s.span_id: s for s in spans}
    (root_run,) = _runs(spans, "orchestrator")
    assert root_run.parent_span_id == ""
    assert root_run.attributes["helix.session_id"] == root
    child_runs = _runs(spans, "researcher") + _runs(spans, "summarizer")
    assert {r.attributes["helix.session_id"] for r in child_runs} == set(children)
    for run in child_runs:
        child_id = run.attributes["helix.session_id"]
        assert run.attributes["helix.agent_type"] == children[child_id] == run.service_name
        assert run.attributes["langfuse.observation.metadata.session_id"] == child_id
        delegation = by_id[run.parent_span_id]
        assert delegation.service_name == "orchestrator"
        assert delegation.name == f"delegate {children[child_id]}"
        assert delegation.attributes["helix.child_session_id"] == child_id
        tool = by_id[delegation.parent_span_id]
        assert tool.attributes["langfuse.observation.type"] == "tool"
        assert (
            tool.attributes["gen_ai.tool.call.id"] == delegation.attributes["gen_ai.tool.call.id"]
        )
        assert by_id[tool.parent_span_id] is root_run
        # The child's own generations and tools hang under its run.
        inner = [s for s in spans if s.parent_span_id == run.span_id]
        assert {s.attributes["langfuse.observation.type"] for s in inner} >= {"generation", "tool"}


async def test_a_killed_and_resumed_orchestrator_stays_in_the_same_trace(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    mesh = _mesh(tmp_path, receiver, HELIX_SCRIPTED_DELAY_MS="20")
    await asyncio.gather(*(s.start() for s in mesh.services.values()))
    root = "trace-root-2"
    try:
        async with await AgentClient.connect(mesh.orchestrator.address) as client:
            await client.start(QUESTION, session_id=root)
            events: list[pb.StreamEvent] = []
            async for event in client.stream(root):
                events.append(event)
                if event.WhichOneof("payload") == "subagent_start":
                    break  # mid-delegation
            await asyncio.sleep(0.5)  # let the first spans be exported
            await mesh.orchestrator.kill()
            await mesh.orchestrator.start()
            events += [e async for e in client.stream(root, from_sequence=events[-1].sequence)]
        assert events[-1].WhichOneof("payload") == "completed"
        assert [e.WhichOneof("payload") for e in events].count("run_resumed") == 1
        await mesh.stop()
    finally:
        await asyncio.gather(*(s.stop() for s in mesh.services.values()))

    spans = receiver.snapshot()
    assert {s.trace_id for s in spans} == {f"{trace_id_for(root):032x}"}
    runs = _runs(spans, "orchestrator")
    resumed = [r for r in runs if r.attributes["helix.resumed"]]
    assert len(resumed) == 1 and resumed[0].attributes["helix.status"] == "completed"
    # Spans exported before the kill (the first model call) are in the same trace.
    before = [g for g in _by_kind(spans, "generation") if g.service_name == "orchestrator"]
    assert any(g.parent_span_id != resumed[0].span_id for g in before)
    assert any(g.parent_span_id == resumed[0].span_id for g in before)
    # Every child run still finds its parent: the resumed orchestrator's delegation
    # spans reuse the ids its children were given before the kill.
    by_id = {s.span_id: s for s in spans}
    child_runs = _runs(spans, "researcher") + _runs(spans, "summarizer")
    assert child_runs
    for run in child_runs:
        assert by_id[run.parent_span_id].name.startswith("delegate ")


async def test_plain_otlp_without_langfuse(tmp_path: Path, receiver: OtlpReceiver) -> None:
    service = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'counter.db'}",
        log_path=tmp_path / "counter.log",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "HELIX_LOG_LEVEL": "WARNING"},
        cwd=ROOT,
    )
    await service.start()
    try:
        async with await AgentClient.connect(service.address) as client:
            await client.start(json.dumps({"steps": 1, "words": 1}), session_id="plain")
            assert [e async for e in client.stream("plain")][-1].WhichOneof("payload") == (
                "completed"
            )
        assert await service.terminate() == 0
    finally:
        await service.stop()
    spans = receiver.snapshot()
    assert {s.path for s in spans} == {"/v1/traces"}
    assert {s.service_name for s in spans} == {"counter"}
    assert {s.trace_id for s in spans} == {f"{trace_id_for('plain'):032x}"}
    assert len(_by_kind(spans, "generation")) == 2
