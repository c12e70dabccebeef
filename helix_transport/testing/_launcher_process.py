"""The launcher process (``launcher.Launcher`` starts it): imports what a service needs,
then forks one service per request. See ``launcher`` for the protocol.

It forks from a single thread with no event loop, no gRPC channel or server and no
store open: what a child inherits is imported modules only, which is what makes a fork
as good as an exec here (gRPC must not have started before a fork).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

READY = b"launcher ready\n"
"""Printed on stdout once the launcher listens."""


def _preload() -> None:
    """Import what ``helix-mesh serve`` imports, litellm first (most of the cost)."""
    import litellm  # noqa: F401

    import helix_transport.cli.main
    import helix_transport.cli.serve
    import helix_transport.server.app  # noqa: F401

    # Kept out of the collector's generations, so children do not copy the pages that a
    # full collection would touch (and do not spend the collection either).
    gc.collect()
    gc.freeze()


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m helix_transport.cli ARGS`` and exit."""
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        log = os.open(request["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # As `python -m` does: the working directory first on the import path, then
        # $PYTHONPATH (read by an interpreter at start, so not by this one).
        sys.path[0] = request["cwd"]
        paths = request["env"].get("PYTHONPATH", "").split(os.pathsep)
        sys.path[1:1] = [p for p in paths if p and p not in sys.path]
        sys.argv = [sys.executable, *request["args"]]
        from helix_transport.cli.main import main

        code = main(request["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


class _Launcher:
    def __init__(self, path: str) -> None:
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.children: dict[int, socket.socket] = {}
        """pid -> its requester's connection (the exit is sent there)."""
        self.buffers: dict[socket.socket, bytes] = {}
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd is what matters
        self.wakeup = wakeup_r
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup, selectors.EVENT_READ, "reap")
        self.selector.register(sys.stdin.buffer, selectors.EVENT_READ, "owner")

    def run(self) -> None:
        sys.stdout.buffer.write(READY)
        sys.stdout.buffer.flush()
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self.buffers[conn] = b""
                    self.selector.register(conn, selectors.EVENT_READ, "request")
                elif key.data == "reap":
                    os.read(self.wakeup, 4096)
                    self._reap()
                elif key.data == "owner":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self._shutdown()
                        return
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]

    def _read(self, conn: socket.socket) -> None:
        data = conn.recv(65536)
        if not data:  # the requester went away: its service goes too
            self._drop(conn)
            return
        self.buffers[conn] += data
        if b"\n" not in self.buffers[conn]:
            return
        line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
        try:
            request = json.loads(line)
            pid = os.fork()
        except Exception as exc:  # a bad request or no fork: said, not fatal
            conn.sendall(json.dumps({"error": repr(exc)}).encode() + b"\n")
            return
        if pid == 0:
            _run_child(request)  # never returns
        self.children[pid] = conn
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                message = {"exit": os.waitstatus_to_exitcode(status)}
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(message).encode() + b"\n")
                self._forget(conn)

    def _drop(self, conn: socket.socket) -> None:
        for pid, owner in list(self.children.items()):
            if owner is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        if conn in self.buffers:
            del self.buffers[conn]
            self.selector.unregister(conn)
            conn.close()

    def _shutdown(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main(argv: list[str]) -> int:
    (path,) = argv
    _preload()
    _Launcher(path).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
