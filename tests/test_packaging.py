"""The wheel installs ``helix_transport`` alone: no top-level ``services`` package lands in
site-packages, and the example services still run from a checkout of the repository
(``helix-mesh serve services.researcher:agent``, the installed console script).

The wheel is built offline from a copy of the build inputs (what the Docker build gets)
and installed into a fresh virtualenv that sees this one's dependencies but neither its
editable install nor this worktree.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helix_transport import AgentClient
from helix_transport._optional import EXTRAS
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


def test_the_wheel_ships_the_proto_contract(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            name.removeprefix("helix_transport/_proto/"): archive.read(name)
            for name in archive.namelist()
            if name.endswith(".proto")
        }
    sources = {
        str(p.relative_to(ROOT / "proto")): p.read_bytes()
        for p in (ROOT / "proto").rglob("*.proto")
    }
    sources = {k: v for k, v in sources.items() if "node_modules" not in k}
    assert "helix/agent/v1/agent.proto" in sources
    assert shipped == sources


def test_helix_mesh_proto_writes_the_contract_for_another_build(venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "contract"
    result = subprocess.run(
        [str(venv / "bin" / "helix-mesh"), "proto", "--out", str(out), "--json"],
        cwd=tmp_path, env=clean_env(), check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    written = sorted(Path(p).relative_to(out).as_posix() for p in json.loads(result.stdout))
    assert written == ["helix/admin/v1/admin.proto", "helix/agent/v1/agent.proto"]
    for name in written:
        assert (out / name).read_bytes() == (ROOT / "proto" / name).read_bytes()
    # What another language's build does with them: protoc compiles them as written.
    from grpc_tools import protoc  # type: ignore[import-untyped]

    include = Path(protoc.__file__).parent / "_proto"
    generated = tmp_path / "generated"
    generated.mkdir()
    args = ["protoc", f"-I{out}", f"-I{include}", f"--python_out={generated}", *written]
    assert protoc.main(args) == 0
    assert (generated / "helix" / "agent" / "v1" / "agent_pb2.py").exists()


# ------------------------------------------------------------------ extras

_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
_TOOLING_EXTRAS = {"dev", "profile"}
"""Extras for working on helix-mesh itself, not features of the library."""


def _distribution(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_every_extra_the_code_names_is_declared_and_all_holds_every_feature() -> None:
    declared = _PYPROJECT["optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    features = set(declared) - _TOOLING_EXTRAS - {"all"}
    (everything,) = declared["all"]
    assert _distribution(everything) == "helix-mesh"
    assert set(everything[everything.index("[") + 1 : everything.index("]")].split(",")) == features
    # The core names no package an extra brings, and never the code generator.
    core = {_distribution(r) for r in _PYPROJECT["dependencies"]}
    for extra in features:
        assert not core & {_distribution(r) for r in declared[extra]}, extra
    assert "grpcio-tools" not in core
    assert "grpcio-tools" in {_distribution(r) for r in declared["dev"]}


_WITHOUT_EXTRAS = '''
import importlib, json, os, pkgutil, sys

BLOCKED = {blocked!r}


class Blocker:
    """What a core-only install looks like: every extra's module is missing."""

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
import helix_transport
from helix_transport._optional import MissingExtra

outcome = {{}}
for info in pkgutil.walk_packages(helix_transport.__path__, "helix_transport."):
    name = info.name
    # Generated code, entry points (a __main__ runs its command) and the private helpers
    # of a backend (imported only by its public module) are not imported on their own.
    if "._proto" in name or name.endswith(".__main__") or "._redis_" in name or "._postgres_" in name:
        continue
    try:
        importlib.import_module(name)
    except MissingExtra as exc:
        outcome[name] = [exc.extra, str(exc)]
    except Exception as exc:
        outcome[name] = ["ERROR", f"{{type(exc).__name__}}: {{exc}}"]
print(json.dumps(outcome))
'''


def _without_extras(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    blocked = sorted({m for modules in EXTRAS.values() for m in modules})
    script = _WITHOUT_EXTRAS.format(blocked=blocked) if code == "walk" else code
    prelude = _WITHOUT_EXTRAS.split("import helix_transport")[0].format(blocked=blocked)
    return subprocess.run(
        [sys.executable, "-c", script if code == "walk" else prelude + code, *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_core_imports_without_any_extra_and_a_missing_one_is_named(tmp_path: Path) -> None:
    result = _without_extras("walk", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout)
    # Only the modules of an extra's feature refuse, each naming its extra and the command.
    assert {name: extra for name, (extra, _) in outcome.items()} == {
        "helix_transport.a2a": "a2a",
        "helix_transport.bench.a2a": "a2a",
        "helix_transport.bench.small_call": "a2a",
        "helix_transport.cli.inspector": "inspect",
        "helix_transport.store.postgres": "postgres",
        "helix_transport.testing.conformance._a2a": "a2a",
        "helix_transport.testing.conformance._a2a_kit": "a2a",
        "helix_transport.store.redis": "redis",
    }, outcome
    for name, (extra, message) in outcome.items():
        assert f"pip install 'helix-mesh[{extra}]'" in message, (name, message)


def test_a_feature_whose_extra_is_missing_says_which_at_the_point_of_use(
    tmp_path: Path,
) -> None:
    # The CLI: a usage error (exit 2) naming the extra, for a store URL and the page.
    code = "from helix_transport.cli import main; raise SystemExit(main(sys.argv[1:]))"
    for args, extra in [
        (["gc", "redis://127.0.0.1:1/0", "--retention", "7d", "--dry-run"], "redis"),
        (["gc", "postgresql://127.0.0.1:1/x", "--retention", "7d", "--dry-run"], "postgres"),
        (["inspect", "127.0.0.1:1", "--port", "0"], "inspect"),
    ]:
        result = _without_extras(code, *args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert f"pip install 'helix-mesh[{extra}]'" in result.stderr, (args, result.stderr)
    # The library: the exporters and the metrics endpoint, where they are set up.
    code = """
import asyncio
from helix_transport._optional import MissingExtra
from helix_transport.metrics import MetricsConfig, start_metrics
from helix_transport.tracing.otel import setup_otel

def extra_of(call):
    try:
        call()
    except MissingExtra as exc:
        assert isinstance(exc, ImportError)
        return exc.extra
    return None

os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
print(extra_of(lambda: setup_otel("svc")))
del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
os.environ.update(LANGFUSE_PUBLIC_KEY="pk", LANGFUSE_SECRET_KEY="sk")
print(extra_of(lambda: setup_otel("svc")))
print(extra_of(lambda: start_metrics(MetricsConfig(port=0))))
"""
    result = _without_extras(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["otlp", "langfuse", "metrics"]
