"""Test helpers: polling, free ports, and agent services in real processes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from helix_transport._exceptions import StoreUnavailable
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.server import AgentServer, ServerConfig, create_server
from helix_transport.store import MemoryStore, Store
from helix_transport.testing.processes import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "ROOT",
    "RestartableServer",
    "ServiceProcess",
    "TcpProxy",
    "assert_eventually",
    "free_port",
    "serve_stream",
    "stream_response",
]


def stream_response(response: pb.StreamResponse | bytes) -> pb.StreamResponse:
    """What the servicer's ``Stream`` yielded, as a message (events come pre-encoded)."""
    return pb.StreamResponse.FromString(response) if isinstance(response, bytes) else response


@contextlib.asynccontextmanager
async def serve_stream(
    stream: Callable[[bytes, Any], AsyncIterator[Any]],
    *,
    serializer: Callable[[Any], bytes] | None = None,
) -> AsyncIterator[str]:
    """A gRPC server on 127.0.0.1 whose ``AgentService.Stream`` is ``stream`` alone
    (it gets the request's bytes): a server that misbehaves exactly as a test says."""
    handler: grpc.RpcMethodHandler[bytes, Any] = grpc.unary_stream_rpc_method_handler(
        stream, response_serializer=serializer
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("helix.agent.v1.AgentService", {"Stream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def assert_eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, interval_s: float = 0.05
) -> None:
    """Poll ``check`` until it returns True, failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


class RestartableServer:
    """One in-process replica that can go down and come back on its port and store.

    It comes back with the same replica id, so it resumes the runs it left checkpointed,
    as a restarted pod would. Shutdowns are immediate: nothing drains.
    """

    def __init__(self, agent: Agent, store: Store, config: ServerConfig) -> None:
        self._agent, self._store, self._config = agent, store, config
        self._server: AgentServer | None = None

    @property
    def address(self) -> str:
        return f"{self._config.host}:{self._config.port}"

    async def start(self) -> None:
        self._server = await create_server(
            self._agent, self._store, self._config, allow_unauthenticated=True
        )
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.shutdown(grace_s=0)  # the run is left checkpointed
            self._server = None

    async def __aenter__(self) -> RestartableServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class TcpProxy:
    """A loopback TCP proxy whose "network" can be dropped and restored.

    ``drop()`` closes the listening socket and resets every open connection, as a
    network partition would; ``restore()`` listens again on the same port.
    """

    def __init__(self, *, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        """Connections accepted so far (a reconnect shows as a second one)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def drop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


class BlinkingStore(MemoryStore):
    """A store whose appends fail while ``down`` is set: a run pauses, then resumes."""

    down = False

    async def append(self, session_id: str, events: Any, **kwargs: Any) -> int:
        if self.down:
            raise StoreUnavailable("appends are failing (a test's outage)")
        return await super().append(session_id, events, **kwargs)
