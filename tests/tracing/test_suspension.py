"""Tracing and metrics of a wait for people: the hooks called as the loop calls them.

A run that asks for input makes a zero-length ``input_required`` span, marks its run
span when it suspends and ends it ``suspended`` (not an error); the run that wakes
the session makes one ``suspended`` span covering the wait, from the time it
suspended (recorded by whichever process that was) to now, beside the run spans in
the session's one trace: keyed on the root session id for a root, under the parent's
delegation span for a child. A parent that suspends while delegating exports its
delegation span once, when the resumed run ends it. Metrics count each suspension
by agent type and each wake-up by reason, with bounded labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

from helix_transport._events import SessionStatus
from helix_transport._metadata import ROOT_SESSION_KEY
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import guarded
from helix_transport.agent.scripted import finish, register_script
from helix_transport.metrics.hooks import metered_hooks
from helix_transport.metrics.instruments import install
from helix_transport.store import SessionRecord, Usage
from helix_transport.tracing.ids import span_id_for, trace_id_for
from helix_transport.tracing.otel import OtelTracing, SpanHooks, make_provider


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = make_provider("mailer")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _record(session_id: str, **kwargs: Any) -> SessionRecord:
    return SessionRecord(
        session_id=session_id, agent_type="mailer", input_json="{}", input_hash="", **kwargs
    )


def _suspend(hooks: SpanHooks, *, request_id: str = "call_1_0") -> None:
    """A first run, as the loop calls it: a step whose call needs an approval."""
    hooks.on_run_start(resumed=False, step=1)
    hooks.on_generation_start(model="scripted/mailer", messages=[])
    hooks.on_generation_end(model="scripted/mailer", output=None, latency_s=0.01)
    hooks.on_input_required(request_id=request_id, tool_name="send_email", kind="approval")
    hooks.on_suspended(request_ids=[request_id], suspended_children=0)
    hooks.on_run_end(status=SessionStatus.SUSPENDED, usage=Usage(), error="")


def _wake(hooks: SpanHooks, *, suspended_at: float, request_id: str = "call_1_0") -> None:
    """The run that wakes it: the answer came, the approved tool runs, the run ends."""
    hooks.on_run_start(resumed=True, step=2)
    hooks.on_resumed(reason="input", suspended_at=suspended_at)
    hooks.on_tool_start(name="send_email", tool_call_id=request_id, arguments_json="{}")
    hooks.on_tool_end(name="send_email", tool_call_id=request_id, result_json="{}", is_error=False)
    hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")


def _named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _attributes(span: ReadableSpan) -> Mapping[str, Any]:
    assert span.attributes is not None
    return span.attributes


def test_a_root_s_wait_is_one_suspended_span_in_its_trace(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    record = _record("root-1")
    _suspend(SpanHooks(provider.get_tracer("t"), agent_type="mailer", record=record))
    suspended_at = time.time() - 42.5  # it waited 42.5 s (hours, in real life)
    before_wake = time.time_ns()
    # Woken in another process: a new SpanHooks from the record, nothing carried over.
    _wake(
        SpanHooks(provider.get_tracer("t"), agent_type="mailer", record=record),
        suspended_at=suspended_at,
    )
    spans = exporter.get_finished_spans()
    first, second = _named(spans, "invoke_agent mailer")
    (asked,) = _named(spans, "input_required")
    (wait,) = _named(spans, "suspended")
    trace_id = trace_id_for("root-1")
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id}

    # The request: a moment under the run that asked.
    assert asked.start_time == asked.end_time
    assert asked.parent is not None and first.context is not None
    assert asked.parent.span_id == first.context.span_id
    assert _attributes(asked)["helix.input.request_id"] == "call_1_0"
    assert _attributes(asked)["gen_ai.tool.name"] == "send_email"
    assert _attributes(asked)["helix.input.kind"] == "approval"

    # The run that suspended: marked, ended as a wait, not as an error.
    assert _attributes(first)["helix.status"] == "suspended"
    assert list(_attributes(first)["helix.suspended.request_ids"]) == ["call_1_0"]
    assert [e.name for e in first.events] == ["suspended"]
    assert first.status.status_code is not StatusCode.ERROR

    # The wait: from when it suspended to the wake-up, a root beside the two runs.
    assert wait.parent is None and first.parent is None and second.parent is None
    assert wait.start_time == int(suspended_at * 1e9)
    assert wait.end_time is not None and before_wake <= wait.end_time <= time.time_ns()
    waited = _attributes(wait)["helix.suspended_s"]
    assert 42.5 <= waited < 42.5 + 60
    assert _attributes(wait)["helix.resume.reason"] == "input"
    assert _attributes(wait)["langfuse.session.id"] == "root-1"
    # A root span of the trace must not rename it "suspended" in Langfuse.
    assert _attributes(wait)["langfuse.trace.name"] == _attributes(first)["langfuse.trace.name"]
    assert _attributes(second)["helix.resume.reason"] == "input"
    assert second.start_time is not None and wait.start_time < second.start_time


def test_a_child_s_wait_is_under_its_parent_s_delegation_span(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    # The parent delegates, its child suspends and so does the parent; then both wake.
    provider, exporter = traced
    tracer = provider.get_tracer("t")
    parent_record = _record("root-1")
    child_id = "root-1-remote-call_1_0"
    suspended_at = time.time() - 5

    parent = SpanHooks(tracer, agent_type="orchestrator", record=parent_record)
    parent.on_run_start(resumed=False, step=1)
    parent.on_tool_start(name="mail", tool_call_id="call_1_0", arguments_json="{}")
    carrier = parent.on_delegation_start(
        tool_call_id="call_1_0", child_session_id=child_id, agent_type="mailer"
    )
    child_record = _record(
        child_id,
        parent_session_id="root-1",
        metadata={**carrier, ROOT_SESSION_KEY: "root-1"},
    )
    _suspend(SpanHooks(tracer, agent_type="mailer", record=child_record))
    parent.on_suspended(request_ids=[], suspended_children=1)
    parent.on_run_end(status=SessionStatus.SUSPENDED, usage=Usage(), error="")
    # Nothing of the delegation exported yet: the resumed parent opens it again.
    assert not _named(exporter.get_finished_spans(), "delegate mailer")
    (cut,) = _named(exporter.get_finished_spans(), "execute_tool mail")
    assert cut.status.status_code is not StatusCode.ERROR  # waiting is not failing

    _wake(SpanHooks(tracer, agent_type="mailer", record=child_record), suspended_at=suspended_at)
    parent = SpanHooks(tracer, agent_type="orchestrator", record=parent_record)
    parent.on_run_start(resumed=True, step=2)
    parent.on_resumed(reason="input", suspended_at=suspended_at + 1)
    parent.on_tool_start(name="mail", tool_call_id="call_1_0", arguments_json="{}")
    parent.on_delegation_start(
        tool_call_id="call_1_0", child_session_id=child_id, agent_type="mailer"
    )
    parent.on_delegation_end(
        tool_call_id="call_1_0", child_session_id=child_id, status=SessionStatus.COMPLETED, error=""
    )
    parent.on_tool_end(name="mail", tool_call_id="call_1_0", result_json="{}", is_error=False)
    parent.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")

    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id_for("root-1")}
    ids = [s.context.span_id for s in spans if s.context is not None]
    assert len(ids) == len(set(ids))  # the delegation span exported once
    (delegation,) = _named(spans, "delegate mailer")
    assert delegation.context is not None
    assert delegation.context.span_id == span_id_for(child_id)
    waits = {_attributes(s)["helix.session_id"]: s for s in _named(spans, "suspended")}
    assert set(waits) == {"root-1", child_id}
    child_wait, parent_wait = waits[child_id], waits["root-1"]
    # The child's wait sits where its runs do: under the delegation span.
    child_runs = _named(spans, "invoke_agent mailer")
    assert len(child_runs) == 2
    for span in [child_wait, *child_runs]:
        assert span.parent is not None and span.parent.span_id == span_id_for(child_id)
    assert child_wait.start_time == int(suspended_at * 1e9)
    # The parent's wait is a root of the session's trace, as its runs are.
    assert parent_wait.parent is None
    assert "langfuse.trace.name" not in _attributes(child_wait)
    assert parent_wait.start_time == int((suspended_at + 1) * 1e9)


def test_a_suspension_stamped_by_a_clock_ahead_never_ends_before_it_starts(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = traced
    hooks = SpanHooks(provider.get_tracer("t"), agent_type="mailer", record=_record("r"))
    hooks.on_run_start(resumed=True, step=2)
    hooks.on_resumed(reason="deadline", suspended_at=time.time() + 30)
    hooks.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")
    (wait,) = _named(exporter.get_finished_spans(), "suspended")
    assert wait.start_time == wait.end_time
    assert _attributes(wait)["helix.suspended_s"] == 0
    assert _attributes(wait)["helix.resume.reason"] == "deadline"


class _OldHook:
    """A hook written before the waits for people: it has none of their methods."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        self.calls.append("run_start")


class _Broken:
    """Raises from each of the new hooks."""

    def on_input_required(self, **kwargs: Any) -> None:
        raise RuntimeError("input_required")

    def on_suspended(self, **kwargs: Any) -> None:
        raise RuntimeError("suspended")

    def on_resumed(self, **kwargs: Any) -> None:
        raise RuntimeError("resumed")


def test_guarded_hooks_skip_an_old_hook_and_swallow_a_broken_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = _OldHook()
    for hook in (guarded(old), guarded(_Broken())):  # type: ignore[arg-type]
        hook.on_input_required(request_id="c", tool_name="t", kind="approval")
        hook.on_suspended(request_ids=["c"], suspended_children=0)
        hook.on_resumed(reason="input", suspended_at=time.time())
    assert old.calls == []
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == [
        "run hook _Broken.on_input_required failed",
        "run hook _Broken.on_suspended failed",
        "run hook _Broken.on_resumed failed",
    ]


# --- Metrics ---------------------------------------------------------------------------


class _Empty(BaseModel):
    pass


mailer = Agent(
    name="mailer",
    description="Sends mail (for the metrics hooks; never run).",
    input_model=_Empty,
    output_model=_Empty,
    model=register_script("tracing-suspension-mailer", lambda messages: finish()),
)


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


def _counts(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        tuple(sorted((point.attributes or {}).items())): point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint)
    }


def test_metrics_count_suspensions_by_agent_type_and_wake_ups_by_reason(
    recorded: InMemoryMetricReader, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    # The hooks a server builds with tracing and metrics on: both, behind one FanOut.
    provider, exporter = traced
    hooks_for = metered_hooks(OtelTracing(provider).hooks_for)
    record = _record("root-1")
    for reason in ("input", "input", "deadline", "something a future version adds"):
        hooks = guarded(hooks_for(mailer, record))
        hooks.on_run_start(resumed=False, step=1)
        hooks.on_input_required(request_id="c", tool_name="send_email", kind="approval")
        hooks.on_suspended(request_ids=["c"], suspended_children=0)
        hooks.on_run_end(status=SessionStatus.SUSPENDED, usage=Usage(), error="")
        woken = guarded(hooks_for(mailer, record))
        woken.on_run_start(resumed=True, step=2)
        woken.on_resumed(reason=reason, suspended_at=time.time() - 1)
    woken.on_run_end(status=SessionStatus.COMPLETED, usage=Usage(), error="")

    agent = ("helix.agent_type", "mailer")
    assert _counts(recorded, "helix.sessions.suspended") == {(agent,): 4}
    assert _counts(recorded, "helix.sessions.resumed") == {
        (agent, ("helix.resume.reason", "input")): 2,
        (agent, ("helix.resume.reason", "deadline")): 1,
        (agent, ("helix.resume.reason", "other")): 1,
    }
    # A suspended run did not end its session: only the one completion is counted.
    assert _counts(recorded, "helix.sessions.ended") == {
        (agent, ("helix.session.status", "completed")): 1
    }
    # The spans' reason is the session's own (a span attribute is no metric label).
    waits = _named(exporter.get_finished_spans(), "suspended")
    assert [_attributes(s)["helix.resume.reason"] for s in waits][-1] == (
        "something a future version adds"
    )
    assert len(waits) == 4 and len(_named(exporter.get_finished_spans(), "input_required")) == 4
