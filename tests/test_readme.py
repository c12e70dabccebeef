"""The README's runnable example runs and prints what it claims, and the docs stay whole.

README.md is the front door (at most 3,000 words); docs/*.md holds every topic. Together they
name every setting the code reads, and every relative link in them leads somewhere.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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
