"""The baseline: a raw ``grpc.aio`` server-streaming RPC, no helix in the path."""

from __future__ import annotations

import asyncio
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import grpc

from helix_transport._config import ClientConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

_SERVICE = "bench.Raw"
_METHOD = f"/{_SERVICE}/Stream"
PACE_KEY = "pace-ms"
"""Request metadata: pause between two messages, like a paced helix emitter."""
BATCH_KEY = "batch"
"""Request metadata: events per message (1 unless set), to match a helix stream's packing."""

RawCall: TypeAlias = "grpc.aio.UnaryStreamMultiCallable[pb.StreamRequest, pb.StreamResponse]"


async def _stream(
    request: pb.StreamRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[pb.StreamResponse]:
    """Send ``from_sequence`` events shaped like a helix text delta, one per message
    (or ``batch`` per message)."""
    pace_s, batch = 0.0, 1
    for key, value in context.invocation_metadata() or ():
        if key == PACE_KEY:
            pace_s = float(value) / 1000
        elif key == BATCH_KEY:
            batch = max(1, int(value))
    event = pb.StreamEvent(
        session_id=request.session_id, agent_type="bench-leaf", step=1, text_delta=pb.TextDelta()
    )
    event.text_delta.text = "x"
    total = request.from_sequence
    for first in range(1, total + 1, batch):
        response = pb.StreamResponse()
        for sequence in range(first, min(first + batch, total + 1)):
            event.sequence = sequence
            event.time.seconds, event.time.nanos = divmod(time.time_ns(), 1_000_000_000)
            response.events.append(event)  # a copy, as it is now
        yield response
        if pace_s:
            await asyncio.sleep(pace_s)


@asynccontextmanager
async def raw_baseline() -> AsyncIterator[RawCall]:
    """A raw server on 127.0.0.1 and a stub to it, with AgentClient's channel options."""
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        _stream,
        request_deserializer=pb.StreamRequest.FromString,
        response_serializer=pb.StreamResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Stream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    options = ClientConfig.default.channel_options()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            yield channel.unary_stream(
                _METHOD,
                request_serializer=pb.StreamRequest.SerializeToString,
                response_deserializer=pb.StreamResponse.FromString,
            )
    finally:
        await server.stop(None)


async def raw_receive(
    stub: RawCall,
    events: int,
    *,
    pace_ms: float = 0,
    batch: int = 1,
    on_event: Callable[[pb.StreamEvent], None] | None = None,
) -> int:
    """Events received from one raw RPC sending ``events`` events, ``batch`` per message."""
    count = 0
    metadata = [(key, str(v)) for key, v in ((PACE_KEY, pace_ms), (BATCH_KEY, batch)) if v != 0]
    # As long as the bench's helix session ids, so the events are as large.
    session_id = "raw-" + "0" * 32
    call = stub(pb.StreamRequest(session_id=session_id, from_sequence=events), metadata=metadata)
    async for response in call:
        count += len(response.events)
        if on_event is not None:
            for event in response.events:
                on_event(event)
    return count


async def _serve_forever(port: int) -> None:
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        _stream,
        request_deserializer=pb.StreamRequest.FromString,
        response_serializer=pb.StreamResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Stream": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


@asynccontextmanager
async def raw_process(port: int) -> AsyncIterator[tuple[RawCall, int]]:
    """The raw server in its own process (like a helix service), a stub, and its pid."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.bench._raw", str(port), stdout=PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            await proc.stdout.readline()  # "serving"
        options = ClientConfig.default.channel_options()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub: RawCall = channel.unary_stream(
                _METHOD,
                request_serializer=pb.StreamRequest.SerializeToString,
                response_deserializer=pb.StreamResponse.FromString,
            )
            yield stub, proc.pid
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


if __name__ == "__main__":
    asyncio.run(_serve_forever(int(sys.argv[1])))
