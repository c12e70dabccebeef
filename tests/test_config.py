"""One configuration surface: every ``HELIX_*`` variable is in ``config.VARIABLES``, read
by ``config.Environment`` alone, documented in ``docs/operating.md`` with the same
default, and an unknown one is named at a service's start."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

import helix_transport
from helix_transport import ConnectionAge, Limits, config
from helix_transport.config import (
    VARIABLES,
    Environment,
    declare,
    markdown_table,
    warn_unknown,
)
from helix_transport.server.auth import AuthConfig
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.helpers import ROOT

PACKAGE = Path(helix_transport.__file__).parent
OPERATING = ROOT / "docs" / "operating.md"
NAMES = {v.name for v in VARIABLES}
FAMILIES = {v.name.removesuffix("<TYPE>") for v in VARIABLES if v.name.endswith("<TYPE>")}


def test_operating_md_has_the_table_of_every_variable() -> None:
    text = OPERATING.read_text()
    start = text.index("| variable | type | default | meaning |")
    end = text.index("\n\n", start)
    assert text[start : end + 1] == markdown_table(), "regenerate with config.markdown_table()"


def test_operating_md_names_no_variable_the_code_does_not_read() -> None:
    """Names like ``HELIX_JWT_*`` stand for the variables they start; ``<TYPE>`` for a family."""
    known = NAMES | {"HELIX_MAILER_OUTBOX"}  # an agent's own (services/mailer declares it)
    mentioned = set(re.findall(r"HELIX_[A-Z0-9_]*(?:<TYPE>|\*)?", OPERATING.read_text()))
    unknown = []
    for name in sorted(mentioned - {"HELIX_TEST_*"}):  # the test suite's own, never warned
        if name.endswith("*"):
            ok = any(k.startswith(name.rstrip("*")) for k in known)
        else:  # `HELIX_LLM_FALLBACKS` (each also `_<TYPE>`), `HELIX_MODEL_ORCHESTRATOR`
            ok = name in known or name.rstrip("_") in known
            ok = ok or any(name.startswith(family) for family in FAMILIES)
        if not ok:
            unknown.append(name)
    assert unknown == []


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_every_variable_of_the_table_is_read_by_the_environment() -> None:
    tree = ast.parse((PACKAGE / "config.py").read_text())
    readers = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Environment")
    others = [n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign | ast.FunctionDef)]
    table = next(
        n for n in others if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "VARIABLES"
    )
    used = _strings(readers) | set().union(*(_strings(n) for n in others if n is not table))
    unread = [
        v.name
        for v in VARIABLES
        if v.name not in used
        and v.name.removesuffix("_<TYPE>") not in used
        and v.name.removesuffix("<TYPE>") not in used
    ]
    assert unread == []


def test_no_other_module_reads_a_helix_variable() -> None:
    """``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` or ``environ.get``
    with a ``HELIX_*`` name, anywhere but ``config.py``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (path.name == "config.py" and path.parent == PACKAGE) or "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                target, name = ast.unparse(node.func), node.args[0]
            elif isinstance(node, ast.Subscript):
                target, name = ast.unparse(node.value) + "[]", node.slice
            else:
                continue
            if not re.search(r"environ|getenv", target):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if isinstance(name, ast.Constant) and str(name.value).startswith("HELIX_"):
                found.append(f"{where} {name.value!s}")
            elif not isinstance(name, ast.Constant) and not target.endswith(
                (".setdefault", ".update")
            ):
                # A name in a variable: only config.py may look one up (a write is not
                # a look-up: the test launcher sets a forked service's environment).
                found.append(f"{where} {ast.unparse(name)}")
    assert found == []


def test_the_tables_defaults_are_the_codes() -> None:
    defaults = {v.name: v.default for v in VARIABLES}
    given = Environment({k: v for k, v in defaults.items() if v not in ("-", "off", "on")})
    empty = Environment({})
    assert given.limits() == empty.limits() == Limits.default
    assert given.connection_age() == empty.connection_age() == ConnectionAge.default
    assert AuthConfig(**given.server_auth()) == AuthConfig(**empty.server_auth()) == AuthConfig()
    for method in ("host", "port", "log_level", "scripted_delay_s", "bench_stores"):
        assert getattr(given, method)() == getattr(empty, method)(), method
    assert empty.store_url("sqlite:///.helix/<agent>.db") == defaults["HELIX_STORE_URL"]
    assert empty.log_format() in ("", defaults["HELIX_LOG_FORMAT"])
    assert empty.service_credentials().identity in ("", defaults["HELIX_CLIENT_IDENTITY"])
    assert empty.reflection() and not empty.allow_volatile_store()
    assert empty.retention() is None and empty.metrics_port() is None


def test_unknown_variables_are_named_with_the_closest_known_one(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "_declared", set())
    env = Environment(
        {
            "HELIX_RATE_LIMT": "5",  # a typo
            "HELIX_NOTHING_LIKE_IT": "1",
            "HELIX_MODEL_RESEARCHER": "m",  # one agent type's: known
            "HELIX_TEST_REDIS_URL": "redis://",  # the test suite's own
            "HELIX_PORT": "1",
            "PATH": "/bin",
        }
    )
    assert env.unknown() == [
        ("HELIX_NOTHING_LIKE_IT", None),
        ("HELIX_RATE_LIMT", "HELIX_RATE_LIMIT"),
    ]
    with caplog.at_level(logging.WARNING, logger="helix.config"):
        warnings = warn_unknown(env)
    assert [r.getMessage() for r in caplog.records] == warnings
    assert warnings[1] == (
        "unknown environment variable HELIX_RATE_LIMT, ignored; did you mean HELIX_RATE_LIMIT?"
    )
    assert declare("HELIX_NOTHING_LIKE_IT") == "HELIX_NOTHING_LIKE_IT"  # an agent's own
    assert [name for name, _ in env.unknown()] == ["HELIX_RATE_LIMT"]


async def test_serve_warns_once_about_an_unknown_variable(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    service = ServiceProcess(
        "tests.agents.failing:refused",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'warn.db'}",
        log_path=log,
        cwd=ROOT,
        env={"HELIX_MAX_RUNING_SESSIONS": "3", "HELIX_LOG_LEVEL": "INFO"},
    )
    await service.start()
    try:
        assert await service.stop() == 0
    finally:
        await service.stop()
    lines = [line for line in log.read_text().splitlines() if "HELIX_MAX_RUNING" in line]
    assert len(lines) == 1, log.read_text()
    assert "did you mean HELIX_MAX_RUNNING_SESSIONS?" in lines[0]
