"""A warm launcher: one process that imports litellm and the server once, then forks each
``helix-mesh`` service a test starts, instead of exec'ing a new interpreter that imports
them again (about 2 s of CPU a service on a quiet 2-core machine, several under load; a
suite starts hundreds).

A forked service is a real process: its own pid, killable with SIGKILL, its exit code or
signal reported as ``asyncio.subprocess.Process`` reports it (``-9`` when killed). What
differs from an exec: the modules it starts with were imported in the launcher, under
the launcher's environment. Nothing the launcher imports reads the environment at import
in a way the services' tests vary (they vary ``HELIX_*``, read when ``serve`` starts);
a test of start-up itself (what a fresh interpreter imports, how long it takes) passes
``spawner=exec_process`` to ``ServiceProcess``.

The launcher is started lazily on first use and closes with its owner (``close``); if
the owner dies, the launcher sees its stdin close, kills the services it forked and
exits. A service whose requester went away (its connection closed) is killed too, so an
aborted test leaves no orphan.

Protocol, one Unix socket connection per service, JSON lines: the requester sends
``{"args", "cwd", "env", "log_path"}``; the launcher answers ``{"pid": N}`` (or
``{"error": "..."}``), then ``{"exit": CODE}`` when the service ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from helix_transport.testing._launcher_process import READY

_CLI = ("-m", "helix_transport.cli")
"""What a forkable command runs after the interpreter: ``python -m helix_transport.cli``."""


class LaunchedProcess:
    """A service forked by the launcher, shaped like ``asyncio.subprocess.Process``."""

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        """The exit code (``-N`` for signal N) once the service has ended, else ``None``."""
        return self._exited.result() if self._exited.done() else None

    def send_signal(self, sig: int) -> None:
        """Send ``sig``; nothing if it has already ended (as asyncio's Process does)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # ended, not yet reported
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        """Wait until the service ends; its exit code."""
        return await asyncio.shield(self._exited)


class _Connection(asyncio.Protocol):
    """The requester's side of one service's connection."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.started: asyncio.Future[int] = loop.create_future()
        self.exited: asyncio.Future[int] = loop.create_future()
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "pid" in message:
                self.started.set_result(int(message["pid"]))
            elif "error" in message:
                self.started.set_exception(RuntimeError(f"launcher: {message['error']}"))
            elif "exit" in message and not self.exited.done():
                self.exited.set_result(int(message["exit"]))

    def connection_lost(self, exc: Exception | None) -> None:
        lost = RuntimeError("launcher: connection lost before the service ended")
        for future in (self.started, self.exited):
            if not future.done():
                future.set_exception(lost)
                future.exception()  # retrieved: a lost launcher is reported by wait()


class Launcher:
    """The requester's handle on a launcher process (one per test process)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()

    @property
    def socket_path(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir.name, "launcher.sock")

    def ensure_started(self) -> None:
        """Start the launcher if it is not running, and wait until it listens (seconds:
        it imports litellm; blocking, so ``spawn`` calls it in a thread)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._dir = tempfile.TemporaryDirectory(prefix="helix-launcher-")
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "helix_transport.testing._launcher_process",
                    self.socket_path,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            assert self._proc.stdout is not None
            line = self._proc.stdout.readline()
            if line != READY:
                self._proc.kill()
                raise RuntimeError(f"launcher did not start: {line!r}")

    async def spawn(
        self, args: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path
    ) -> LaunchedProcess:
        """Fork ``args`` (``python -m helix_transport.cli ...``) from the warm launcher,
        its stdout and stderr appended to ``log_path``."""
        if tuple(args[1:3]) != _CLI:
            raise ValueError(f"the launcher forks only `python -m helix_transport.cli`: {args}")
        await asyncio.to_thread(self.ensure_started)
        loop = asyncio.get_running_loop()
        transport, connection = await loop.create_unix_connection(_Connection, self.socket_path)
        request = {
            "args": list(args[3:]),
            "cwd": str(cwd),
            "env": dict(env),
            "log_path": str(log_path),
        }
        transport.write(json.dumps(request).encode() + b"\n")
        try:
            pid = await connection.started
        except BaseException:
            transport.close()  # the launcher kills a service whose connection closes
            raise
        connection.exited.add_done_callback(lambda _: transport.close())
        return LaunchedProcess(pid, connection.exited)

    def close(self) -> None:
        """Stop the launcher: it kills what it forked that still runs, and exits."""
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
