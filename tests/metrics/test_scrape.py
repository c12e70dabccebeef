"""The metrics of real services, scraped over HTTP during a delegation.

A parent service (``remote-caller``, authenticated by a token file, at most one
running session) delegates to a child service (``echo``), each its own process with
``--metrics-port`` and its own SQLite file. Both ``/metrics`` are parsed with the
Prometheus text parser; the counters must move by exactly what happened: one session
started and completed on each side, the tokens each side's model reported (its
``GetStatus`` usage), every event of the parent's log appended once, and the three
refused calls (no token, bad input, over capacity) under their reasons.
"""

from __future__ import annotations

import asyncio
import secrets
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helix_transport import AgentClient, ClientAuth, EventStream, RetryConfig
from helix_transport._exceptions import InvalidArgument, ResourceExhausted, Unauthenticated
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port

# A pause per streamed chunk of every model call: runs last seconds, long enough to
# be seen running by a scrape, and for a second Start to find the parent full.
DELAY_MS = "1500"


@dataclass
class Service:
    process: ServiceProcess
    metrics_port: int

    async def scrape(self) -> Samples:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return str(reply.read().decode())

        return Samples(await asyncio.to_thread(get))


class Samples:
    """One scrape: each sample's value by name and labels."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.samples += [(s.name, s.labels, s.value) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        return sum(
            value
            for sample, have, value in self.samples
            if sample == name and all(have.get(k) == v for k, v in labels.items())
        )

    def labelsets(self, name: str) -> list[dict[str, str]]:
        return [have for sample, have, _ in self.samples if sample == name]


@dataclass
class Mesh:
    parent: Service
    child: Service
    token: str


def _service(agent: str, workdir: Path, *, env: dict[str, str], auth: list[str]) -> Service:
    port = free_port()
    process = ServiceProcess(
        f"tests.agents.trees:{agent}",
        port=port,
        store_url=f"sqlite:///{workdir / (agent + '.db')}",
        log_path=workdir / f"{agent}.log",
        env={"HELIX_SCRIPTED_DELAY_MS": DELAY_MS, **env},
        extra_args=["--metrics-port", str(metrics_port := free_port())],
        auth_args=auth,
        cwd=ROOT,
    )
    return Service(process, metrics_port)


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    token = secrets.token_urlsafe(24)
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{token} alice\n")
    child = _service("echo", tmp_path, env={}, auth=["--allow-unauthenticated"])
    parent = _service(
        "remote_caller",
        tmp_path,
        env={"HELIX_AGENT_ADDRESS_ECHO": child.process.address},
        auth=["--auth-tokens", str(tokens), "--max-running-sessions", "1"],
    )
    await asyncio.gather(child.process.start(), parent.process.start())
    try:
        yield Mesh(parent=parent, child=child, token=token)
    finally:
        await asyncio.gather(parent.process.stop(), child.process.stop())


async def _refusals(mesh: Mesh, client: AgentClient) -> None:
    """One call refused for each reason the parent can give here."""
    with pytest.raises(InvalidArgument):
        await client.start('{"text": 5}')
    with pytest.raises(ResourceExhausted):  # the first session still runs
        # No retry: the client would wait out the hint and start it after the first.
        await client.start('{"text": "another"}', retry=RetryConfig(deadline=timedelta(0)))
    async with await AgentClient.connect(mesh.parent.process.address) as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.start('{"text": "hi"}')


async def test_a_delegation_moves_the_counters_by_what_happened(mesh: Mesh) -> None:
    parent, child = mesh.parent, mesh.child
    before = await parent.scrape()
    assert before.types["helix_sessions_running"] == "gauge"
    assert before.value("helix_sessions_running") == 0
    auth = ClientAuth(token=mesh.token)
    async with await AgentClient.connect(parent.process.address, auth=auth) as client:
        started = await client.start('{"text": "hi"}')
        stream = client.stream(started.session_id)
        events = asyncio.ensure_future(_collect(stream))

        async def both_running() -> bool:
            seen_parent, seen_child = await asyncio.gather(parent.scrape(), child.scrape())
            return (
                seen_parent.value("helix_sessions_running") == 1
                and seen_parent.value("helix_stream_readers", rpc_method="Stream") == 1
                and seen_child.value("helix_sessions_running") == 1
            )

        # The autoscaling signal, while the child works for the parent.
        await assert_eventually(both_running, timeout_s=30, interval_s=0.05)
        await _refusals(mesh, client)
        status = await client.wait(started.session_id)
        assert status.status == pb.SessionStatus.SESSION_STATUS_COMPLETED
        total = await client.get_status(started.session_id, include_children=True)
        received = await events
    seen_parent, seen_child = await parent.scrape(), await child.scrape()

    _check_sessions(seen_parent, "remote-caller")
    _check_sessions(seen_child, "echo")
    _check_tokens(seen_parent, status.usage.prompt_tokens, status.usage.completion_tokens)
    _check_tokens(
        seen_child,
        total.total_usage.prompt_tokens - status.usage.prompt_tokens,
        total.total_usage.completion_tokens - status.usage.completion_tokens,
    )
    # Every event of the parent's log, the child's forwarded ones included, once.
    assert seen_parent.value("helix_events_appended_total") == status.last_sequence
    assert [e.sequence for e in received] == list(range(1, status.last_sequence + 1))
    _check_histograms(seen_parent)
    _check_refusals(seen_parent)
    assert seen_parent.value("helix_stream_readers") == 0


async def _collect(stream: EventStream) -> list[pb.StreamEvent]:
    return [event async for event in stream]


def _check_sessions(seen: Samples, agent_type: str) -> None:
    assert seen.value("helix_sessions_started_total", helix_agent_type=agent_type) == 1
    ended = seen.labelsets("helix_sessions_ended_total")
    assert ended == [{"helix_agent_type": agent_type, "helix_session_status": "completed"}]
    assert seen.value("helix_sessions_ended_total") == 1
    assert seen.value("helix_sessions_running") == 0
    assert seen.value("helix_sessions_resumed_total") == 0


def _check_tokens(seen: Samples, prompt: int, completion: int) -> None:
    assert prompt > 0 and completion > 0
    name = "gen_ai_client_token_usage_sum"
    assert seen.value(name, gen_ai_token_type="input") == prompt
    assert seen.value(name, gen_ai_token_type="output") == completion
    models = {labels["gen_ai_request_model"] for labels in seen.labelsets(name)}
    assert len(models) == 1 and models.pop().startswith("scripted/")
    calls = seen.value("gen_ai_client_operation_duration_seconds_count")
    assert calls == seen.value("gen_ai_client_token_usage_count", gen_ai_token_type="input") > 0


def _check_histograms(seen: Samples) -> None:
    """Every duration the parent measures has samples, none labelled by a session."""
    assert seen.value("helix_child_duration_seconds_count", helix_child_agent_type="echo") == 1
    assert seen.value("helix_tool_duration_seconds_count", gen_ai_tool_name="ask") == 1
    assert seen.value("helix_step_duration_seconds_count") >= 2  # the call, the answer
    assert seen.value("rpc_server_call_duration_seconds_count", rpc_method="Start") == 4
    ok = seen.value("rpc_server_call_duration_seconds_count", rpc_grpc_status_code="0")
    assert ok >= 3  # Start, Stream, the waits
    for operation in ("create_session", "append", "get_session"):
        count = seen.value(
            "helix_store_operation_duration_seconds_count",
            helix_store_backend="sqlite",
            helix_store_operation=operation,
        )
        assert count >= 1, operation
    for _, labels, _ in seen.samples:
        assert not any("session" in key for key in labels if key != "helix_session_status")


def _check_refusals(seen: Samples) -> None:
    refused = {
        labels["helix_refusal_reason"]: seen.value("helix_refusals_total", **labels)
        for labels in seen.labelsets("helix_refusals_total")
    }
    assert refused == {"bad_input": 1, "capacity": 1, "auth": 1}
