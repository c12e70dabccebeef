"""The README's examples run as written, and the docs stay whole.

Each example is run as a user would: saved under the README's file name in a directory
outside this repository (so nothing from ``services/`` can be imported), with the library
on the path as an install would put it; the served modules by ``helix-mesh serve``, and the
shell commands exactly as printed (only their ports moved to free ones).

README.md is the front door (at most 3,000 words); docs/*.md holds every topic. Together they
name every setting the code reads, and every relative link in them leads somewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import ROOT, free_port

EXAMPLE_FILES = ("glossary.py", "assistant.py", "ask.py")
"""The README's Python blocks, in order, by the file name it gives each."""
README_PORTS = ("50061", "50062")
"""The ports the README's commands use (glossary, assistant)."""
SERVE_TIMEOUT_S = 90.0


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    text = _readme()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A directory outside the repository holding the README's examples under their names,
    their ports moved to free ones; ``lib/`` holds only ``helix_transport`` (as an install
    would), so a ``services.*`` import in an example fails."""
    blocks = re.findall(r"```python\n(.*?)```", _readme(), flags=re.S)
    assert len(blocks) == len(EXAMPLE_FILES), "a Python block was added or removed"
    for name in EXAMPLE_FILES:
        assert f"`{name}`" in _readme(), f"the README no longer names {name}"
    home = tmp_path / "user"
    lib = home / "lib"
    lib.mkdir(parents=True)
    (lib / "helix_transport").symlink_to(ROOT / "helix_transport")
    ports = {written: str(free_port()) for written in README_PORTS}
    for name, block in zip(EXAMPLE_FILES, blocks, strict=True):
        (home / name).write_text(_with_ports(block, ports))
    (home / "ports.json").write_text(json.dumps(ports))
    return home


def _with_ports(text: str, ports: dict[str, str]) -> str:
    for written, free in ports.items():
        text = text.replace(written, free)
    return text


def _user_env(home: Path) -> dict[str, str]:
    """This environment as a user's shell: the venv's scripts on PATH, the library from
    ``lib/`` only, no repository on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(home / "lib")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_complete_agent_runs_as_a_script(user_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "glossary.py"], cwd=user_dir, env=_user_env(user_dir),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "1 run_started"
    assert lines[-2].endswith(" completed")
    assert json.loads(lines[-1]) == {
        "answer": "event log: a gapless, sequence-numbered log of events"
    }


def _shell_commands(section: str) -> list[str]:
    """The commands of the section's plain code block, continuation lines joined."""
    plain = re.sub(r"```python\n.*?```", "", section, flags=re.S)
    (block,) = re.findall(r"```\n(.*?)```", plain, flags=re.S)
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


async def _wait_serving(address: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise AssertionError(f"the service exited:\n{await _tail(log)}")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{address} not serving:\n{await _tail(log)}")


async def _tail(log: Path) -> str:
    return (await asyncio.to_thread(log.read_text))[-3000:]


async def _run(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_second_service_calls_the_first_as_the_readme_says(user_dir: Path) -> None:
    ports = json.loads((user_dir / "ports.json").read_text())
    serve_glossary, serve_assistant, call = (
        _with_ports(c, ports) for c in _shell_commands(_section("Calling another service"))
    )
    env = _user_env(user_dir)
    served: list[tuple[asyncio.subprocess.Process, Path]] = []
    try:
        for index, command in enumerate((serve_glossary, serve_assistant)):
            assert " serve " in command, command
            log = user_dir / f"serve-{index}.log"
            with log.open("wb") as out:
                # bash runs a lone command in its own place: signals reach helix-mesh.
                proc = await asyncio.create_subprocess_exec(
                    "bash", "-c", command, cwd=user_dir, env=env, stdout=out, stderr=out
                )
            served.append((proc, log))
        for (proc, log), port in zip(served, README_PORTS, strict=True):
            await _wait_serving(f"127.0.0.1:{ports[port]}", proc, log)
        # Serving glossary.py imported it: its __main__ guard kept the demo from running.
        assert "run_started" not in await _tail(served[0][1])

        code, stdout, stderr = await _run("bash", "-c", call, cwd=user_dir, env=env)
        assert code == 0, stderr[-2000:]
        # The glossary's events, nested under the assistant's, then the output shown.
        assert re.search(r"^  \[glossary .*\] completed$", stdout, flags=re.M), stdout
        shown = re.search(r'`(\{"reply": .*?\})`', _section("Calling another service"))
        assert shown is not None
        assert json.loads(stdout[stdout.rindex("\n{") :]) == json.loads(shown[1])

        # The plain client, `python ask.py`, against the same parent.
        code, stdout, stderr = await _run(sys.executable, "ask.py", cwd=user_dir, env=env)
        assert code == 0, stderr[-2000:]
        lines = stdout.strip().splitlines()
        assert lines[0] == "1 run_started"
        assert any(line.endswith(" child_event") for line in lines)
        assert json.loads(lines[-1]) == json.loads(shown[1])
    finally:
        for proc, log in served:
            if proc.returncode is None:
                proc.terminate()
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
            sys.stderr.write(await _tail(log))


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_setting_read_from_the_environment_is_named_in_the_docs() -> None:
    readme = "\n".join(path.read_text() for path in _documents())
    names: set[str] = set()
    for package in ("helix_transport", "services"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"\bHELIX_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    # One setting per agent type, documented as HELIX_AGENT_ADDRESS_<TYPE>.
    names = {n for n in names if not n.startswith("HELIX_AGENT_ADDRESS_")}
    assert len(names) > 20  # the scan found the settings at all
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", readme))
    assert not missing, f"settings neither README.md nor docs/ name: {missing}"


def test_the_readme_stays_under_3000_words() -> None:
    words = len((ROOT / "README.md").read_text().split())
    assert 0 < words <= 3000, f"README.md has {words} words; move detail into docs/"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_every_relative_link_in_the_docs_leads_somewhere() -> None:
    checked = 0
    broken = []
    for document in _documents():
        # Fenced code is not markdown: a `[x](y)` there is code, not a link.
        text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto: and the like
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            checked += 1
            if not linked.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 20  # the scan found the links at all
    assert not broken, broken
