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
