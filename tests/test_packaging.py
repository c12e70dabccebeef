"""The wheel installs ``helix_transport`` alone: no top-level ``services`` package lands in
site-packages, and the example services still run from a checkout of the repository
(``helix-mesh serve services.researcher:agent``, the installed console script).

The wheel is built offline from a copy of the build inputs (what the Docker build gets)
and installed into a fresh virtualenv that sees this one's dependencies but neither its
editable install nor this worktree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helix_transport import AgentClient
from helix_transport.testing.processes import free_port
from tests.helpers import ROOT

SERVE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built without network (setuptools from this environment)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "*.db*", ".helix")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("helix_transport", "services"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = (work / "dist").glob("helix_mesh-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the wheel; its dependencies come from this environment's
    site-packages as a plain path (so its .pth files, the editable finder among them,
    are not run)."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return root


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: only what the virtualenv itself has."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_wheel_has_no_top_level_services_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert "helix_transport" in tops
    assert "services" not in tops, sorted(tops)


def test_the_wheel_ships_the_inspect_page(wheel: Path) -> None:
    # `helix-mesh inspect` serves these from the installed package: no build step.
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    static = "helix_transport/cli/inspector/static/"
    assert {static + n for n in ("index.html", "app.js", "style.css")} <= names


def test_the_installed_wheel_does_not_provide_services(venv: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.util as u;"
        "print(u.find_spec('helix_transport').origin, u.find_spec('services') is None)"
    )
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path, env=clean_env(), check=True, capture_output=True, text=True,
    )  # fmt: skip
    origin, no_services = result.stdout.split()
    assert Path(origin).is_relative_to(venv)  # the wheel's copy, not this worktree's
    assert no_services == "True", "site-packages holds a top-level services package"


async def wait_serving(address: str, proc: asyncio.subprocess.Process) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        async with asyncio.timeout(SERVE_TIMEOUT_S):
            while True:
                assert proc.returncode is None, "helix-mesh serve exited"
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "serve.log"
    yield path
    if path.exists():
        sys.stderr.write(path.read_text()[-3000:])


async def test_the_console_script_serves_an_example_service_from_the_checkout(
    venv: Path, log_file: Path
) -> None:
    port = free_port()
    with log_file.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "helix-mesh"), "serve", "services.researcher:agent",
            "--port", str(port), "--store", "memory://", "--allow-unauthenticated",
            cwd=ROOT, env=clean_env(), stdout=log, stderr=log,
        )  # fmt: skip
    try:
        await wait_serving(f"127.0.0.1:{port}", proc)
        async with await AgentClient.connect(f"127.0.0.1:{port}") as client:
            described = await client.describe()
        assert described.agent_type == "researcher"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
