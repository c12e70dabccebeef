"""Issue 50's target 3: a small call to an agent whose model is a trivial in-process
``Model`` (no litellm), beside the a2a-sdk reference server's small call.

Ours: ``Start`` then ``Stream`` to completed, over the native gRPC client, on the
memory store. Theirs: one streamed ``send_message`` to the reference server
(``DefaultRequestHandler``, in-memory task store) whose executor publishes the task,
one text artifact and completed, read by the SDK's own client. Both in this process
over 127.0.0.1. Each side's client is its protocol's own; the work is one text event
and a result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from helix_transport import Agent
from helix_transport._optional import requires
from helix_transport.agent.model import ModelResponse, ToolCall
from helix_transport.agent.tools import FINISH_TOOL
from helix_transport.bench._measure import Ids, check_completed, latencies_ms
from helix_transport.bench._report import Report, percentile, ratio_at_most, summary
from helix_transport.bench.a2a import _leaf_message, reference_server
from helix_transport.bench.agents import LeafInput, LeafOutput, leaf_input
from helix_transport.bench.streams import bench_store
from helix_transport.server.app import create_server
from helix_transport.store import Usage
from helix_transport.transport import AgentClient

with requires("a2a", "the small-call row (its baseline is the A2A reference)"):
    from a2a.client import ClientConfig, create_client


class InstantModel:
    """A model that finishes at once: one text delta, then the finish tool."""

    model_name = "in-process/instant"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        on_text: Callable[[str], None],
        settings: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ModelResponse:
        on_text("ok")
        arguments = json.dumps({"events": LeafInput.model_validate_json(messages[-1]["content"]).n})
        return ModelResponse(
            text="ok",
            tool_calls=[ToolCall(id="call_instant", name=FINISH_TOOL, arguments_json=arguments)],
            usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
            provider="in-process",
        )


instant = Agent(
    name="bench-instant",
    description="Finishes at once through an in-process model: no litellm call.",
    input_model=LeafInput,
    output_model=LeafOutput,
    model=InstantModel(),
    max_steps=1,
)


async def small_call(report: Report, tmp: Path, ids: Ids, *, calls: int) -> None:
    """The row: helix's small-call p50 (and p99) beside the reference server's."""
    async with (
        bench_store("memory", tmp) as store,
        await create_server(instant, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):

        async def ours() -> None:
            session_id = ids("small")
            await client.start(leaf_input(), session_id=session_id)
            final = None
            async for event in client.stream(session_id):
                final = event
            assert final is not None
            check_completed(final)

        helix_ms = await latencies_ms(ours, calls)
    async with (
        reference_server(1) as url,
        httpx.AsyncClient(timeout=60) as http,
    ):
        a2a_client = await create_client(url, client_config=ClientConfig(httpx_client=http))

        async def theirs() -> None:
            events = [event async for event in a2a_client.send_message(_leaf_message(1))]
            assert events, "the reference server sent nothing"

        reference_ms = await latencies_ms(theirs, calls)
    baseline_is = "a2a-sdk reference server, its client, JSON-RPC + SSE"
    for p, target in ((50, ratio_at_most(1.0)), (99, None)):
        report.add(
            f"3 small call, in-process Model, p{p}, {calls} calls",
            "memory, in-process",
            "ms",
            percentile(helix_ms, p),
            percentile(reference_ms, p),
            baseline_is,
            target,
        )
    report.details["3 small call ms"] = {
        "helix": summary(helix_ms),
        "a2a_reference": summary(reference_ms),
    }
