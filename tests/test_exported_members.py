"""The public facade stays complete, sorted and cheap to import."""

import ast
import subprocess
import sys

import helix_transport
from tests.helpers import ROOT

# What a new user writes first: an agent, and the three ways it delegates to another.
HEADLINE = {
    "Agent",
    "PersistentChild",
    "SubagentType",
    "ToolContext",
    "remote_agent_tool",
    "remote_agent_tool_from_service",
    "tool",
    "with_companions",
    "with_dispatch",
}


def test_all_is_sorted_and_every_name_resolves() -> None:
    names = helix_transport.__all__
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert set(names) == set(helix_transport._LAZY)
    for name in names:
        value = getattr(helix_transport, name)
        assert getattr(value, "__name__", name) == name


def test_the_delegation_entry_points_are_in_the_facade() -> None:
    assert set(helix_transport.__all__) >= HEADLINE


def test_example_services_import_what_the_facade_has_from_it() -> None:
    """The services are what users copy: a name the facade has is not taken from deep inside."""
    agents = sorted((ROOT / "services").glob("*/agent.py"))
    assert agents
    deep = [
        f"{path.relative_to(ROOT)}: {alias.name} from {node.module}"
        for path in agents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helix_transport.")
        for alias in node.names
        if alias.name in helix_transport.__all__
    ]
    assert deep == []


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        helix_transport.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_client_side_imports_do_not_load_litellm() -> None:
    code = "import sys, helix_transport.cli, helix_transport; helix_transport.AgentClient; print('litellm' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
