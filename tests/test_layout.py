"""The library's shape: no import cycle, every module importable on its own, no module
over 600 lines (but the known ones, which shrink to nothing).

The cycle check reads the source (``ast``), ``TYPE_CHECKING`` and function-level
imports included: a cycle hidden behind either still ties the modules together.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import helix_transport

PACKAGE = Path(helix_transport.__file__).parent
ROOT = PACKAGE.parent
GENERATED = PACKAGE / "_proto"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports, wherever the import statement is."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"  # `from pkg import module` names a module
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (found := visit(target)) is not None:
                return found
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (found := visit(module)) is not None:
            return found
    return None


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or ())


@pytest.mark.timeout(300)
def test_each_module_imports_on_its_own() -> None:
    """Every module imports first in a fresh interpreter: a cycle that works from one
    entry point only (the facade's order) fails here."""
    names = [n for n in _modules() if not n.endswith("__main__")]
    # One interpreter loads every third-party module the package uses, once (a first
    # fork imports the whole package to name them); each module then imports in a fork
    # of it that has loaded nothing of helix_transport, two forks at a time (the
    # package's own code is all that runs in each: half the CPU of loading litellm's
    # dependencies again in each).
    script = textwrap.dedent(
        """
        import importlib, json, os, sys, traceback

        names = json.loads(sys.argv[1])
        read, write = os.pipe()
        if os.fork() == 0:  # what the package imports from outside it
            os.close(read)
            for name in names:
                try:
                    importlib.import_module(name)
                except BaseException:
                    pass  # the fork of that module says why
            outside = [m for m in sys.modules if not m.startswith("helix_transport")]
            os.write(write, json.dumps(outside).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            outside = json.loads(pipe.read())
        os.wait()
        for name in outside:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:
                    pass  # a module that imports only as another's part
        assert not any(m.startswith("helix_transport") for m in sys.modules)

        failed, running = {}, {}

        def reap():
            pid, status = os.wait()
            name, read = running.pop(pid)
            with os.fdopen(read, "rb") as pipe:
                error = pipe.read().decode()
            if status != 0:
                failed[name] = error or f"exit status {status}"

        for name in names:
            while len(running) >= 2:
                reap()
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                try:
                    importlib.import_module(name)
                    code = 0
                except BaseException:
                    os.write(write, traceback.format_exc().encode()[-2000:])
                    code = 1
                os._exit(code)
            os.close(write)
            running[pid] = (name, read)
        while running:
            reap()
        print(json.dumps(failed))
        """
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(names)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


def test_no_module_over_600_lines() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
        if GENERATED not in path.parents
    }
    over = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert over == {}, f"over {MAX_LINES} lines: {over}"


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_module_imported_across_packages() -> None:
    """A module named ``_x`` is its package's own: imported only from that package
    (its directory and below). The top-level ones (``_exceptions``, ``_config``,
    ``_events``...) are thereby the whole library's shared core. Another package takes
    a name from the package's ``__init__``, which is what keeps the inside movable."""
    modules = _modules()
    crossings = []
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for target in sorted(_imports(name, path, modules)):
            parts = target.split(".")
            owners = [parts[:i] for i, part in enumerate(parts) if _is_private(part)]
            if any(package[: len(owner)] != owner for owner in owners):
                crossings.append(f"{name} imports {target}")
    assert crossings == [], "\n".join(crossings)


MAX_FUNCTION_LINES = 80


def test_no_function_over_80_lines() -> None:
    """A function is read whole: past about 80 lines it does more than one thing."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    where = path.relative_to(ROOT).as_posix()
                    long.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
