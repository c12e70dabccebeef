"""The warm launcher forks services that behave as exec'd ones do where tests look: a real
pid, SIGKILL and exit codes, the environment, working directory and log they were given,
and no orphan when the test that started one goes away."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helix_transport.testing.launcher import Launcher
from helix_transport.testing.processes import ServiceProcess, free_port

CLI = [sys.executable, "-m", "helix_transport.cli"]


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    own = Launcher()  # not the suite's: closing it is part of a test
    yield own
    own.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_forked_service_serves_and_reports_sigkill_as_minus_nine(
    launcher: Launcher, tmp_path: Path
) -> None:
    service = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'c.db'}",
        log_path=tmp_path / "c.log",
        spawner=launcher.spawn,
    )
    await service.start()
    proc = service.proc
    assert proc is not None and proc.returncode is None and _alive(proc.pid)
    proc.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    assert proc.returncode == -signal.SIGKILL
    assert "listening on 127.0.0.1" in (tmp_path / "c.log").read_text()


async def test_a_clean_exit_code_cwd_and_environment_are_the_requests(
    launcher: Launcher, tmp_path: Path
) -> None:
    # A usage error of the real CLI exits 2 and says so on stderr, into the log given.
    log = tmp_path / "usage.log"
    proc = await launcher.spawn([*CLI, "gc"], cwd=tmp_path, env=os.environ, log_path=log)
    assert await asyncio.wait_for(proc.wait(), 60) == 2
    assert "required: STORE_URL" in log.read_text()
    # `serve` of a module that exists only in the request's working directory: found
    # there (sys.path[0], as `python -m` does), and the variable given reaches it.
    (tmp_path / "probe_agent.py").write_text(
        "import os, sys\n"
        "print('cwd', os.getcwd(), 'var', os.environ['PROBE_VALUE'], flush=True)\n"
        "sys.exit(7)\n"
    )
    proc = await launcher.spawn(
        [*CLI, "serve", "probe_agent:agent", "--allow-unauthenticated"],
        cwd=tmp_path,
        env={**os.environ, "PROBE_VALUE": "from-the-request"},
        log_path=tmp_path / "probe.log",
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 7
    assert f"cwd {tmp_path} var from-the-request" in (tmp_path / "probe.log").read_text()
    # Found on the request's $PYTHONPATH too, from another directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = await launcher.spawn(
        [*CLI, "serve", "probe_agent:agent", "--allow-unauthenticated"],
        cwd=elsewhere,
        env={**os.environ, "PROBE_VALUE": "v2", "PYTHONPATH": str(tmp_path)},
        log_path=tmp_path / "probe2.log",
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 7
    assert f"cwd {elsewhere} var v2" in (tmp_path / "probe2.log").read_text()


def test_a_service_whose_requester_went_away_is_killed(launcher: Launcher, tmp_path: Path) -> None:
    # A test process that dies, or a loop torn down with its transports: the service's
    # connection closes, and the launcher kills what it started, so no service outlives
    # its test as an orphan. Spoken on a plain socket, to close it at a known point.
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    launcher.ensure_started()
    request = {
        "args": ["serve", "sleeper:agent"],
        "cwd": str(tmp_path),
        "env": dict(os.environ),
        "log_path": str(tmp_path / "sleeper.log"),
    }
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(launcher.socket_path)
        conn.sendall(json.dumps(request).encode() + b"\n")
        pid = json.loads(conn.makefile().readline())["pid"]
        assert _alive(pid)
    for _ in range(500):
        if not _alive(pid):
            break
        time.sleep(0.02)
    assert not _alive(pid)


async def test_only_the_cli_is_forked(launcher: Launcher, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"only `python -m helix_transport\.cli`"):
        await launcher.spawn(
            [sys.executable, "-c", "pass"], cwd=tmp_path, env=os.environ,
            log_path=tmp_path / "log",
        )  # fmt: skip


def test_closing_the_launcher_kills_what_it_forked(tmp_path: Path) -> None:
    own = Launcher()
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(300)\n")

    async def start() -> int:
        proc = await own.spawn(
            [*CLI, "serve", "sleeper:agent"], cwd=tmp_path, env=os.environ,
            log_path=tmp_path / "log",
        )  # fmt: skip
        return proc.pid

    # A loop that stays open: the connection is not what ends the service here.
    loop = asyncio.new_event_loop()
    try:
        pid = loop.run_until_complete(start())
        assert _alive(pid)
        own.close()
        assert not _alive(pid)
    finally:
        loop.close()
