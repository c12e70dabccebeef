"""The Node.js service continues a caller's W3C trace: ``traceparent`` in gRPC metadata.

The service calls no other service and exports no spans, so the trace continues in its
log: every line about a session names the ``trace_id`` and the caller's span
(``parent_span_id``) of the ``Start`` that created it, across a SIGKILL and a restart
too (the context is kept in the session's file). An invalid ``traceparent`` is ignored,
as W3C Trace Context says, and never fails the call.
"""

from __future__ import annotations

import json
import re
import secrets

import grpc

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc
from tests.interop.conftest import NodeService, StartNode

SHORT = json.dumps({"text": "hello world"})
LONG = json.dumps({"text": " ".join(["the agent reads the log"] * 8), "words_per_step": 1})


def traceparent() -> tuple[str, str, str]:
    """``(header, trace_id, span_id)``: a fresh, sampled W3C traceparent."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def start(node: NodeService, session_id: str, input_json: str, header: str | None) -> None:
    metadata = None if header is None else (("traceparent", header),)
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        request = pb.StartRequest(session_id=session_id, input_json=input_json)
        reply = await stub.Start(request, metadata=metadata, timeout=10)
    assert reply.created


async def wait_ended(node: NodeService, *session_ids: str) -> None:
    async with await AgentClient.connect(node.address) as client:
        for session_id in session_ids:
            status = await client.wait(session_id)
            assert status.status == pb.SESSION_STATUS_COMPLETED, status


def log_lines(node: NodeService, session_id: str) -> list[str]:
    """The service's log lines about ``session_id``, without their timestamps."""
    pattern = re.compile(rf"translator-node: (session {re.escape(session_id)} .*)$")
    lines = node.log_path.read_text().splitlines()
    return [m.group(1) for m in map(pattern.search, lines) if m]


async def test_each_log_line_of_a_session_names_its_callers_trace(start_node: StartNode) -> None:
    header, trace_id, span_id = traceparent()
    trace = f"trace_id={trace_id} parent_span_id={span_id}"
    async with start_node(name="trace") as node:
        await start(node, "traced", SHORT, header)
        await start(node, "untraced", SHORT, None)
        await wait_ended(node, "traced", "untraced")

        assert log_lines(node, "traced") == [
            f"session traced started {trace}",
            f"session traced ended completed {trace}",
        ]
        assert log_lines(node, "untraced") == [
            "session untraced started",
            "session untraced ended completed",
        ]


async def test_an_invalid_traceparent_is_ignored(start_node: StartNode) -> None:
    _, trace_id, span_id = traceparent()
    invalid = {
        "upper-case": f"00-{trace_id.upper()}-{span_id}-01",
        "zero-trace": f"00-{'0' * 32}-{span_id}-01",
        "zero-span": f"00-{trace_id}-{'0' * 16}-01",
        "version-ff": f"ff-{trace_id}-{span_id}-01",
        "v00-extra": f"00-{trace_id}-{span_id}-01-extra",
        "short": f"00-{trace_id[:31]}-{span_id}-01",
    }
    async with start_node(name="invalid") as node:
        for name, header in invalid.items():
            await start(node, name, SHORT, header)
        await wait_ended(node, *invalid)
        for name in invalid:
            assert log_lines(node, name) == [
                f"session {name} started",
                f"session {name} ended completed",
            ]
        # A later version may append fields: read as version 00.
        await start(node, "v01", SHORT, f"01-{trace_id}-{span_id}-00-more")
        await wait_ended(node, "v01")
        assert f"session v01 started trace_id={trace_id} parent_span_id={span_id}" in (
            log_lines(node, "v01")
        )


async def test_a_resumed_session_still_names_its_trace(start_node: StartNode) -> None:
    header, trace_id, span_id = traceparent()
    trace = f"trace_id={trace_id} parent_span_id={span_id}"
    async with start_node(delay_ms=20, name="resume") as node:
        await start(node, "long", LONG, header)
        async with await AgentClient.connect(node.address) as client:
            async for event in client.stream("long"):
                if event.sequence == 12:  # mid-run, some steps checkpointed
                    break
        await node.kill()  # SIGKILL: nothing but the file survives
        await node.start()
        await wait_ended(node, "long")

        lines = log_lines(node, "long")
    assert lines[0] == f"session long started {trace}"
    assert re.fullmatch(rf"session long resumed at step \d+ {trace}", lines[1]), lines
    assert lines[2:] == [f"session long ended completed {trace}"]
