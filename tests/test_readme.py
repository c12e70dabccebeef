"""The README's runnable example runs and prints what it claims."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import ROOT


def test_readme_example_serves_and_calls_an_agent() -> None:
    readme = (ROOT / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    result = subprocess.run(
        [sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "1 run_started"
    assert lines[-2].endswith(" completed")
    assert json.loads(lines[-1]) == {
        "answer": "event log: a gapless, sequence-numbered log of events"
    }


def test_every_setting_read_from_the_environment_is_named_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    names: set[str] = set()
    for package in ("helix_transport", "services"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"\bHELIX_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    # One setting per agent type, documented as HELIX_AGENT_ADDRESS_<TYPE>.
    names = {n for n in names if not n.startswith("HELIX_AGENT_ADDRESS_")}
    assert len(names) > 20  # the scan found the settings at all
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", readme))
    assert not missing, f"settings the README does not name: {missing}"
