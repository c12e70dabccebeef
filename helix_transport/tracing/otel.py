"""OpenTelemetry spans from the run hooks, exported to Langfuse and/or any OTLP endpoint.

One trace per root session, across every service it touches:

- the trace id is a function of the root session id (``trace_id_for``), so a run
  resumed after a crash, in any process, lands in the same trace;
- a child session's run span is parented to the remote parent span in its
  metadata (W3C ``traceparent``, put there by the parent's delegation span);
- the delegation span's id is a function of the child session id, so the child's
  parent link still resolves when a resumed parent delegates again.

Spans (``service.name`` = the agent type, the resource of each service)::

    invoke_agent orchestrator          run (one per run; a resume adds one)
      chat <model>                     generation, with token usage
      execute_tool research            tool call
        delegate researcher            remote delegation -> traceparent
          invoke_agent researcher      (in the researcher's service)
      execute_tool run_subagent        dispatch: one delegation per task, each
        delegate researcher            ending when the task's end is recorded
      execute_tool companion__spawn_agent
        delegate critic                a companion: one per child; every turn's run
          invoke_agent critic          nests under it (Continue carries no context)
      input_required                   a request for input (zero-length)
    suspended                          the wait for people, beside the runs: made when
    invoke_agent orchestrator          a run wakes the session, from when it suspended

Every span goes through a ``BatchSpanProcessor``: the loop only enqueues.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from helix_transport._events import SessionStatus
from helix_transport._optional import requires
from helix_transport.agent.hooks import RunHooks
from helix_transport.store import Usage
from helix_transport.tracing.ids import Ids, forced_ids, span_id_for, trace_id_for
from helix_transport.tracing.rpc import (
    ServerSpans,
    SessionKey,
    caller_span_context,
    client_spans,
    session_trace,
)

if TYPE_CHECKING:
    from helix_transport.agent.definition import Agent
    from helix_transport.agent.model import ModelResponse
    from helix_transport.store import SessionRecord

logger = logging.getLogger("helix.tracing")

TRACER_NAME = "helix_transport"
MAX_ATTRIBUTE_CHARS = 16_000
"""Inputs and outputs are cut to this many characters in span attributes."""

_PROPAGATOR = TraceContextTextMapPropagator()


def make_provider(service_name: str) -> TracerProvider:
    """A tracer provider for one service: its resource names it, its ids can be forced."""
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    return TracerProvider(resource=Resource.create({SERVICE_NAME: name}), id_generator=Ids())


class OtelTracing:
    """A service's tracing: its provider, and the hooks of each run it starts."""

    def __init__(
        self, provider: TracerProvider, *, closers: Sequence[Callable[[], object]] = ()
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)
        self._closers = list(closers)
        self._closed = False

    def hooks_for(self, agent: Agent, record: SessionRecord) -> RunHooks:
        """The hooks of one run of ``record`` (a ``HooksFactory``)."""
        return SpanHooks(self.tracer, agent_type=agent.name, record=record)

    def server_interceptor(self, session_key: SessionKey) -> grpc.aio.ServerInterceptor:
        """SERVER spans for the service's RPCs (``session_key``: a request's session id
        to the session's key, in the caller's namespace)."""
        return ServerSpans(self.tracer, session_key=session_key)

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """CLIENT spans for the calls the service makes to its children."""
        return client_spans(self.tracer)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every ended span now; False when the exporters did not finish in time."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush and stop every exporter (idempotent; errors are logged, not raised)."""
        if self._closed:
            return
        self._closed = True
        for close in [*self._closers, self.provider.shutdown]:
            try:
                close()
            except Exception:
                logger.warning("tracing shutdown: %r failed", close, exc_info=True)


_langfuse_taken = False
"""Whether this process has set up Langfuse (see ``setup_otel``)."""


def _export_all(span: object) -> bool:
    """Langfuse exports only LLM-library spans by default; every span here is one of ours."""
    return True


def setup_otel(service_name: str) -> OtelTracing | None:
    """Tracing from the environment: Langfuse (``LANGFUSE_PUBLIC_KEY``, ``LANGFUSE_SECRET_KEY``,
    ``LANGFUSE_HOST``) and/or plain OTLP/HTTP (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``None`` when neither is set.

    One Langfuse set-up per process: Langfuse's client is one per public key and
    process, so a second provider (another service, or this one set up again after
    ``shutdown``) gets no Langfuse exporter; this logs a warning then.
    """
    global _langfuse_taken
    env = os.environ
    langfuse = bool(env.get("LANGFUSE_PUBLIC_KEY") and env.get("LANGFUSE_SECRET_KEY"))
    otlp = bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    if not (langfuse or otlp):
        return None
    provider = make_provider(service_name)
    closers: list[Callable[[], object]] = []
    if langfuse:
        with requires("langfuse", "span export to Langfuse (LANGFUSE_PUBLIC_KEY)"):
            from langfuse import Langfuse

        if _langfuse_taken:
            logger.warning(
                "tracing %s: Langfuse is already set up in this process, and its client "
                "is one per process: these spans reach Langfuse only through OTLP, if set",
                service_name,
            )
        _langfuse_taken = True
        # The official client adds its own batching processor and OTLP/HTTP exporter
        # (``{LANGFUSE_HOST}/api/public/otel/v1/traces``, basic auth) to our provider.
        client = Langfuse(tracer_provider=provider, should_export_span=_export_all)
        closers.append(client.shutdown)
    if otlp:
        with requires("otlp", "span export over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: SpanProcessor = BatchSpanProcessor(OTLPSpanExporter())
        provider.add_span_processor(processor)
    logger.info(
        "tracing %s to %s",
        service_name,
        " and ".join(n for n, on in (("Langfuse", langfuse), ("OTLP", otlp)) if on),
    )
    return OtelTracing(provider, closers=closers)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ATTRIBUTE_CHARS else text[:MAX_ATTRIBUTE_CHARS] + "…"


def _json(value: Any) -> str:
    try:
        return _cut(json.dumps(value, default=str))
    except Exception:  # pragma: no cover - default=str makes this unlikely
        return _cut(repr(value))


def _response_attributes(output: ModelResponse) -> dict[str, str | float | list[str]]:
    """What litellm said about the call: provider, model answering, finish reasons, cost."""
    attributes: dict[str, str | float | list[str]] = {
        "gen_ai.response.finish_reasons": list(output.finish_reasons),
    }
    if output.provider:
        attributes["gen_ai.provider.name"] = output.provider
    if output.response_model:
        attributes["gen_ai.response.model"] = output.response_model
    if output.cost_usd is not None:
        attributes["gen_ai.usage.cost"] = output.cost_usd
        attributes["langfuse.observation.cost_details"] = json.dumps({"total": output.cost_usd})
    return attributes


class SpanHooks:
    """The hooks of one run, as OpenTelemetry spans (not thread-safe: the loop's thread)."""

    def __init__(self, tracer: trace.Tracer, *, agent_type: str, record: SessionRecord) -> None:
        self.tracer = tracer
        self.agent_type = agent_type
        self.record = record
        where = session_trace(record)
        self.root_session_id = where.root_session_id
        self.joined = where.joined
        self._parent: Context | None = where.parent  # None: a root run, its trace id forced
        self._attached: Token[Context] | None = None
        self._common: dict[str, str] = {
            "session.id": self.root_session_id,
            "langfuse.session.id": self.root_session_id,
            "helix.session_id": record.session_id,
            "helix.agent_type": agent_type,
        }
        self._run: Span | None = None
        self._generation: Span | None = None
        self._tools: dict[str, Span] = {}
        self._tool_contexts: dict[str, Token[Context]] = {}  # attach tokens, by call id
        # By child session id: one tool call may start several (run_subagent).
        self._delegations: dict[str, Span] = {}

    def _start(
        self,
        name: str,
        attributes: Mapping[str, str | int | float | bool],
        *,
        parent: Span | None = None,
        beside_run: bool = False,
        span_id: int | None = None,
        links: Sequence[Link] = (),
        start_time: int | None = None,
    ) -> Span:
        """A span under ``parent`` (default: the run's), or ``beside_run``: where the
        run span itself goes (under the remote parent, or a root in the session's trace)."""
        parent = None if beside_run else parent or self._run
        context = trace.set_span_in_context(parent) if parent is not None else self._parent
        trace_id = None if context is not None else trace_id_for(self.root_session_id)
        with forced_ids(trace_id=trace_id, span_id=span_id):
            return self.tracer.start_span(
                name,
                context=context if context is not None else Context(),
                kind=SpanKind.INTERNAL,
                attributes={**self._common, **attributes},
                links=links,
                start_time=start_time,
            )

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        record = self.record
        attributes: dict[str, str | int | bool] = {
            "langfuse.observation.type": "agent",
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.agent_type,
            "helix.root_session_id": self.root_session_id,
            "helix.parent_session_id": record.parent_session_id,
            "helix.resumed": resumed,
            "helix.step": step,
            "langfuse.observation.metadata.session_id": record.session_id,
            "langfuse.observation.metadata.agent_type": self.agent_type,
            "langfuse.observation.metadata.resumed": str(resumed).lower(),
            "langfuse.observation.input": _cut(record.input_json),
        }
        links: list[Link] = []
        if not record.parent_session_id and not self.joined:
            # The trace is the session's own (a joined trace is the caller's to name).
            attributes["langfuse.trace.name"] = self.agent_type
            attributes["langfuse.trace.input"] = _cut(record.input_json)
            caller = caller_span_context()  # the caller of the Start that began this run
            if caller is not None:
                links.append(Link(caller, {"helix.link": "caller"}))
        self._run = self._start(f"invoke_agent {self.agent_type}", attributes, links=links)
        # Current for the rest of the run's task (its tools' tasks inherit it): the
        # calls the run makes to children get CLIENT spans in the session's trace.
        self._attached = otel_context.attach(trace.set_span_in_context(self._run))

    def on_turn_start(self, *, turn: int, message: str, fresh: bool) -> None:
        # The record's input is the session's first; this run works on the turn's message.
        if self._run is not None:
            self._run.set_attributes(
                {
                    "helix.turn": turn,
                    "langfuse.observation.metadata.turn": str(turn),
                    "langfuse.observation.input": _cut(message),
                }
            )

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        suspended = status is SessionStatus.SUSPENDED
        cut_off = [*self._tools.values(), self._generation]
        if status is not SessionStatus.RUNNING and not suspended:
            # A stopped (or suspended) run's delegations are not exported: the resumed
            # run opens each again with the same span id, and one id must not be
            # exported twice.
            cut_off += self._delegations.values()
        for span in cut_off:
            if span is None:
                continue
            if suspended:  # a call waiting on a suspended child: it goes on after the wait
                span.set_attribute("langfuse.observation.status_message", "suspended")
            else:  # cut off (cancelled): end them before their parent
                span.set_status(Status(StatusCode.ERROR, "run stopped"))
            span.end()
        self._delegations.clear()
        self._tools.clear()
        self._tool_contexts.clear()  # their tasks are over: nothing to detach
        self._generation = None
        run, self._run = self._run, None
        if run is None:
            return
        if self._attached is not None:
            attached, self._attached = self._attached, None
            otel_context.detach(attached)
        # Not gen_ai.usage.*: Langfuse sums usage over a trace's observations, and the
        # generations below already carry it (once).
        run.set_attributes(
            {
                "helix.status": status.value,
                "helix.usage.input_tokens": usage.prompt_tokens,
                "helix.usage.output_tokens": usage.completion_tokens,
                "helix.usage.total_tokens": usage.total_tokens,
            }
        )
        if status is SessionStatus.FAILED:
            run.set_attribute("langfuse.observation.level", "ERROR")
            run.set_attribute("langfuse.observation.status_message", _cut(error))
            run.set_status(Status(StatusCode.ERROR, error))
        elif status is SessionStatus.RUNNING:
            run.set_attribute("langfuse.observation.status_message", "stopped; resumable")
        elif suspended:
            run.set_attribute("langfuse.observation.status_message", "suspended; waits for input")
        run.end()

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        self._generation = self._start(
            f"chat {model}",
            {
                "langfuse.observation.type": "generation",
                "gen_ai.operation.name": "chat",
                # The name's prefix until litellm says which provider answered.
                "gen_ai.provider.name": model.split("/", 1)[0] if "/" in model else "litellm",
                "gen_ai.request.model": model,
                "langfuse.observation.model.name": model,
                "langfuse.observation.input": _json(messages),
            },
        )

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        span, self._generation = self._generation, None
        if span is None:
            return
        span.set_attribute("helix.latency_ms", round(latency_s * 1000, 3))
        if output is None:
            span.set_attribute("langfuse.observation.level", "ERROR")
            span.set_status(Status(StatusCode.ERROR, "model call failed"))
        else:
            usage = output.usage
            span.set_attributes(_response_attributes(output))
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": usage.prompt_tokens,
                    "gen_ai.usage.output_tokens": usage.completion_tokens,
                    "langfuse.observation.usage_details": json.dumps(
                        {
                            "input": usage.prompt_tokens,
                            "output": usage.completion_tokens,
                            "total": usage.total_tokens,
                        }
                    ),
                    "langfuse.observation.output": _json(output.to_message()),
                }
            )
        span.end()

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        span = self._tools[tool_call_id] = self._start(
            f"execute_tool {name}",
            {
                "langfuse.observation.type": "tool",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": tool_call_id,
                "langfuse.observation.input": _cut(arguments_json),
            },
        )
        # Each call runs in a task of its own: current there, its calls to children
        # (a remote agent's Start and Stream) get CLIENT spans under it.
        self._tool_contexts[tool_call_id] = otel_context.attach(trace.set_span_in_context(span))

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        span = self._tools.pop(tool_call_id, None)
        if span is None:
            return
        if (attached := self._tool_contexts.pop(tool_call_id, None)) is not None:
            otel_context.detach(attached)
        span.set_attribute("langfuse.observation.output", _cut(result_json))
        if is_error:
            span.set_attribute("langfuse.observation.level", "ERROR")
            span.set_status(Status(StatusCode.ERROR, "tool error"))
        span.end()

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        span = self._delegations.get(child_session_id)
        if span is None:  # else opened already by this run: one span per id
            span = self._delegations[child_session_id] = self._delegation(
                tool_call_id, child_session_id, agent_type
            )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def _delegation(self, tool_call_id: str, child_session_id: str, agent_type: str) -> Span:
        return self._start(
            f"delegate {agent_type}",
            {
                "langfuse.observation.type": "span",
                "gen_ai.tool.call.id": tool_call_id,
                "helix.child_session_id": child_session_id,
                "helix.child_agent_type": agent_type,
                "langfuse.observation.metadata.child_session_id": child_session_id,
                "langfuse.observation.metadata.child_agent_type": agent_type,
            },
            parent=self._tools.get(tool_call_id),
            # The same id when a resumed parent delegates to the same child again.
            span_id=span_id_for(child_session_id),
        )

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        span = self._delegations.pop(child_session_id, None)
        if span is None:
            return
        span.set_attribute("helix.child_status", status.value)
        if status is not SessionStatus.COMPLETED:
            span.set_attribute("langfuse.observation.level", "ERROR")
            span.set_status(Status(StatusCode.ERROR, error or status.value))
        span.end()

    def on_input_required(self, *, request_id: str, tool_name: str, kind: str) -> None:
        # A moment, not a wait: the wait is the `suspended` span, made on waking (no
        # process lives through it to hold a span open).
        now = time.time_ns()
        span = self._start(
            "input_required",
            {
                "langfuse.observation.type": "event",
                "gen_ai.tool.name": tool_name,
                "gen_ai.tool.call.id": request_id,
                "helix.input.request_id": request_id,
                "helix.input.kind": kind,
                "langfuse.observation.metadata.request_id": request_id,
                "langfuse.observation.metadata.kind": kind,
            },
            start_time=now,
        )
        span.end(end_time=now)

    def on_suspended(self, *, request_ids: Sequence[str], suspended_children: int) -> None:
        if self._run is None:
            return
        attributes: dict[str, list[str] | int] = {
            "helix.suspended.request_ids": list(request_ids),
            "helix.suspended.children": suspended_children,
        }
        self._run.add_event("suspended", attributes)
        self._run.set_attributes(attributes)

    def on_resumed(self, *, reason: str, suspended_at: float) -> None:
        now = time.time_ns()
        # Another process suspended it, by its clock: never start after the end.
        start = min(max(int(suspended_at * 1e9), 0), now)
        waited_s = round((now - start) / 1e9, 3)
        if self._run is not None:
            self._run.set_attribute("helix.resume.reason", reason)
        attributes: dict[str, str | float] = {
            "langfuse.observation.type": "span",
            "helix.resume.reason": reason,
            "helix.suspended_s": waited_s,
            "langfuse.observation.metadata.resume_reason": reason,
        }
        if self._parent is None:
            # A root of the trace, like the runs: Langfuse names a trace after a root
            # span, so it says the trace's name (the runs') rather than its own.
            attributes["langfuse.trace.name"] = self.agent_type
        # Beside the runs, between the one that suspended and this one, in the same
        # trace (keyed on the root session id, or under the same remote parent).
        span = self._start("suspended", attributes, beside_run=True, start_time=start)
        span.end(end_time=now)
