"""The public facade stays complete, sorted and cheap to import."""

import subprocess
import sys

import helix_transport


def test_all_is_sorted_and_every_name_resolves() -> None:
    names = helix_transport.__all__
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    assert set(names) == set(helix_transport._LAZY)
    for name in names:
        value = getattr(helix_transport, name)
        assert getattr(value, "__name__", name) == name


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        helix_transport.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
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
