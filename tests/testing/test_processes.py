"""``ServiceProcess.stop``: SIGTERM and a bounded wait, SIGKILL only as a last resort."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from helix_transport.testing.processes import ServiceProcess, free_port

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(300)\n"
)


async def _process(code: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), timeout=60) == b"ready\n"
    return proc


def _service(tmp_path: Path) -> ServiceProcess:
    return ServiceProcess(
        "tests.agents:counter", port=free_port(), store_url="memory://", log_path=tmp_path / "log"
    )


async def test_stop_kills_a_process_that_ignores_sigterm_after_the_wait(tmp_path: Path) -> None:
    service = _service(tmp_path)
    service.proc = await _process(IGNORES_SIGTERM)
    started = time.monotonic()
    assert await service.stop(timeout_s=1.0) == -signal.SIGKILL
    assert time.monotonic() - started >= 1.0  # it was given its chance first
    assert service.proc is None
    assert await service.stop() is None  # nothing running: nothing to do


async def test_stop_lets_a_process_exit_on_sigterm(tmp_path: Path) -> None:
    service = _service(tmp_path)
    service.proc = await _process(
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    assert await service.stop(timeout_s=60) == 0  # exited by itself, not killed
