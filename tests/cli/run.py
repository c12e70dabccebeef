"""Running ``helix-mesh`` as a real process: through pipes, or on a pseudo-terminal."""

from __future__ import annotations

import asyncio
import os
import pty
import sys

from tests.helpers import ROOT

CLI_TIMEOUT_S = 90.0


async def cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``helix-mesh ARGS``: its exit code, standard output and standard error."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", *args,
        cwd=ROOT, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(
        proc.communicate(stdin.encode() if stdin is not None else None), CLI_TIMEOUT_S
    )
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def cli_on_a_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``helix-mesh ARGS`` with its standard output on a pseudo-terminal (as a
    person at a terminal runs it): its exit code and what it wrote there."""
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", *args,
        cwd=ROOT, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL, stdout=follower, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(follower)
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []

    def read_all() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    try:
        reading = loop.run_in_executor(None, read_all)
        await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)  # drains stderr
        await asyncio.wait_for(reading, CLI_TIMEOUT_S)
    finally:
        os.close(leader)
    assert proc.returncode is not None
    return proc.returncode, b"".join(chunks).decode().replace("\r\n", "\n")
