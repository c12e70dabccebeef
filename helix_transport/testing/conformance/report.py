"""What the conformance kit reports: one ``CheckResult`` per check, and a table of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one contract check."""

    name: str
    """Dotted, stable name, e.g. ``stream.gapless``."""
    passed: bool
    """False when the service broke the contract (a skipped check counts as passed)."""
    detail: str = ""
    """What was seen: the evidence for a failure, the facts behind a pass."""
    skipped: bool = False
    """True when the kit could not run the check (the detail says why)."""


def format_results(results: list[CheckResult]) -> str:
    """A pass/fail table, one check per line, and a summary line."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for result in results:
        mark = "SKIP" if result.skipped else "PASS" if result.passed else "FAIL"
        lines.append(f"{mark}  {result.name.ljust(width)}  {result.detail}")
    failed = sum(not r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    passed = len(results) - failed - skipped
    lines.append(f"{len(results)} checks: {passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)
