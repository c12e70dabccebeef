"""Agent services in real processes, for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_MODEL_READY = "helix.model"
"""``helix_transport.server.app.MODEL_READY`` (not imported: the server's modules are
heavy, and a test helper that starts processes needs none of them)."""

STOP_TIMEOUT_S = 20.0
"""How long ``ServiceProcess.stop`` waits after SIGTERM: the default drain (10 s), then
the exporters' flush, with room to spare on a loaded machine."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess(Protocol):
    """What ``ServiceProcess`` needs of a process: ``asyncio.subprocess.Process``'s shape."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    async def wait(self) -> int: ...


class Spawner(Protocol):
    """Starts ``args`` with its stdout and stderr appended to ``log_path``."""

    async def __call__(
        self, args: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
    ) -> ChildProcess: ...


async def exec_process(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
) -> ChildProcess:
    """A new interpreter (fork and exec): what an orchestrator does, start-up included."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *args, cwd=cwd, env=dict(env), stdout=log, stderr=log
        )


class ServiceProcess:
    """``helix-mesh serve AGENT`` in its own process, on a fixed port, killable."""

    default_spawner: ClassVar[Spawner] = exec_process
    """How services start unless one is given: a new interpreter. The test suite sets a
    warm launcher here (``launcher.Launcher.spawn``: forks with litellm imported)."""

    def __init__(
        self,
        agent: str,
        *,
        port: int,
        store_url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        cwd: Path | None = None,
        auth_args: list[str] | None = None,
        health_port: int | None = None,
        spawner: Spawner | None = None,
    ) -> None:
        """``auth_args`` are the authentication flags (default ``--allow-unauthenticated``:
        tests on loopback); ``health_port`` serves and polls health on a plaintext port
        of its own (needed when the main port does TLS); ``spawner`` starts the process
        (default ``default_spawner``; ``exec_process`` for a test of start-up itself)."""
        self.agent = agent
        self.port = port
        self.store_url = store_url
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.extra_args = extra_args or []
        self.auth_args = ["--allow-unauthenticated"] if auth_args is None else auth_args
        self.health_port = health_port
        self.cwd = cwd or Path.cwd()
        self.spawner = spawner
        self.proc: ChildProcess | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    async def start(self, *, timeout_s: float = 120.0, ready: str = _MODEL_READY) -> None:
        """Start the process and wait until its health check says SERVING for ``ready``
        (``wait_serving``; within ``timeout_s``: importing litellm alone took 20 s on a
        loaded 2-core machine).

        Raises:
            RuntimeError: it is already running (a second start would orphan it).
        """
        if self.proc is not None and self.proc.returncode is None:
            raise RuntimeError(f"{self.agent} on port {self.port} is already running")
        args = [
            sys.executable, "-m", "helix_transport.cli", "serve", self.agent,
            "--port", str(self.port), "--store", self.store_url,
            "--replica-id", f"local-{self.port}", *self.auth_args, *self.extra_args,
        ]  # fmt: skip
        if self.health_port is not None:
            args += ["--health-port", str(self.health_port)]
        spawn = self.spawner or ServiceProcess.default_spawner
        self.proc = await spawn(args, cwd=self.cwd, env=self.env, log_path=self.log_path)
        try:
            await self.wait_serving(timeout_s=timeout_s, service=ready)
        except BaseException:
            await self.kill()  # not left running unwatched
            raise

    async def wait_serving(
        self, *, timeout_s: float, poll_s: float = 0.02, service: str = _MODEL_READY
    ) -> None:
        """Poll ``grpc.health.v1`` every ``poll_s`` until the service says SERVING for
        ``service``: by default once litellm is loaded too, which a service does after it
        serves (``""``: as soon as it serves), so tests and benches measure it warm."""
        deadline = time.monotonic() + timeout_s
        health = self.address if self.health_port is None else f"127.0.0.1:{self.health_port}"
        # Opened before the server listens, a channel with gRPC's default reconnect
        # backoff (1 s, growing) noticed SERVING seconds late: the recovery bench's
        # clock started after the parent had already been receiving events again.
        fast_reconnect = [
            ("grpc.initial_reconnect_backoff_ms", 10),
            ("grpc.min_reconnect_backoff_ms", 10),
            ("grpc.max_reconnect_backoff_ms", 50),
        ]
        async with grpc.aio.insecure_channel(health, options=fast_reconnect) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc is not None and self.proc.returncode is not None:
                    raise RuntimeError(f"server exited early:\n{self.log_path.read_text()[-3000:]}")
                try:
                    request = health_pb2.HealthCheckRequest(service=service)
                    reply = await stub.Check(request, timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not serving:\n{self.log_path.read_text()[-3000:]}")
                await asyncio.sleep(poll_s)

    async def kill(self) -> None:
        """SIGKILL: no drain, no checkpoint beyond what is already in the store."""
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            self.proc = None

    async def terminate(self, *, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout_s):
            code = await self.proc.wait()
        self.proc = None
        return code

    async def stop(self, *, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Stop the process if it is still running, as an orchestrator would: SIGTERM
        (it drains its runs and flushes its traces and metrics), then SIGKILL if it has
        not exited within ``timeout_s``. Returns its exit code (``-9`` when killed),
        ``None`` when it was not running. A test that means a crash calls ``kill``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout_s):
                    await proc.wait()
            except TimeoutError:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGKILL)
                await proc.wait()
        return proc.returncode
