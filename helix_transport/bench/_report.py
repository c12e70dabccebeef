"""Benchmark rows, their targets, and the table and JSON they print as."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import grpc

Unit = Literal["events/s", "ms", "MB"]
"""MB is 10**6 bytes, the unit the issue sets the memory target in."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """What the issue asks of a row: a bound on its ratio or on its value."""

    on: Literal["ratio", "value"]
    at_least: float | None = None
    at_most: float | None = None

    def met(self, row: Row) -> bool:
        """Whether ``row`` meets the target (NaN never does)."""
        x = row.ratio if self.on == "ratio" else row.value
        if math.isnan(x):
            return False
        if self.at_least is not None and x < self.at_least:
            return False
        return self.at_most is None or x <= self.at_most

    def describe(self, unit: Unit) -> str:
        """``>= 0.9x``, ``<= 50 ms`` and the like."""
        bound = self.at_least if self.at_least is not None else self.at_most
        sign = ">=" if self.at_least is not None else "<="
        if self.on == "ratio":
            return f"{sign} {bound:g}x"
        return f"{sign} {bound:g} {'ev/s' if unit == 'events/s' else unit}"


def ratio_at_least(x: float) -> Target:
    """Target: value / baseline >= x."""
    return Target(on="ratio", at_least=x)


def ratio_at_most(x: float) -> Target:
    """Target: value / baseline <= x."""
    return Target(on="ratio", at_most=x)


def value_at_most(x: float) -> Target:
    """Target: value <= x (in the row's unit)."""
    return Target(on="value", at_most=x)


@dataclass(frozen=True, kw_only=True)
class Row:
    """One figure beside the baseline measured in the same run."""

    scenario: str
    """Number and name, e.g. ``1 live stream, 10,000 events``."""
    setup: str
    """Store and topology, e.g. ``memory, in-process``."""
    unit: Unit
    value: float
    baseline: float
    baseline_is: str
    ratio: float
    """value / baseline: for events/s below 1 is slower; for ms and MB above 1 is more."""
    target: str = ""
    """The issue's target for this row, empty when it sets none."""
    met: bool | None = None
    """Whether the target is met; ``None`` without a target."""


@dataclass
class Report:
    """Everything one run measured."""

    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(
        self,
        scenario: str,
        setup: str,
        unit: Unit,
        value: float,
        baseline: float,
        baseline_is: str,
        target: Target | None = None,
    ) -> Row:
        """Add a row; the ratio and the target check are computed here."""
        ratio = value / baseline if baseline else float("nan")
        row = Row(
            scenario=scenario,
            setup=setup,
            unit=unit,
            value=value,
            baseline=baseline,
            baseline_is=baseline_is,
            ratio=ratio,
        )
        if target is not None:
            row = Row(**{**asdict(row), "target": target.describe(unit), "met": target.met(row)})
        self.rows.append(row)
        return row


def percentile(samples: list[float], p: int) -> float:
    """The ``p``-th percentile (inclusive method); the sample itself for one sample."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


def summary(samples: list[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean, rounded, for the JSON details."""
    return {
        "n": len(samples),
        "p50": round(percentile(samples, 50), 3),
        "p90": round(percentile(samples, 90), 3),
        "p99": round(percentile(samples, 99), 3),
        "max": round(max(samples), 3),
        "mean": round(statistics.fmean(samples), 3),
    }


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "nproc": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "grpcio": grpc.__version__,
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def _fmt(value: float, unit: Unit) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "events/s":
        return f"{value:,.0f} ev/s"
    if unit == "MB":
        return f"{value:,.1f} MB"
    return f"{value:,.2f} ms"


def _aligned(table: Sequence[Sequence[str]], *, left: set[int]) -> list[str]:
    """A header row and data rows as aligned columns (``left`` ones left-aligned), with
    a rule under the header."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = []
    for i, line in enumerate(table):
        cells = [
            c.ljust(w) if j in left else c.rjust(w)
            for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_table(report: Report, *, params: dict[str, Any], elapsed_s: float) -> str:
    """The report as a plain-text table with a header and the notes."""
    info = machine()
    lines = [
        f"helix-mesh bench: nproc {info['nproc']}, {info['python']}, grpcio {info['grpcio']}, "
        f"load average {info['loadavg_1m_at_end']} at the end",
        "params: " + ", ".join(f"{k}={v}" for k, v in params.items()),
        "",
    ]
    header = ("scenario", "setup", "helix", "baseline", "ratio", "target", "met", "baseline is")
    table = [header] + [
        (
            r.scenario,
            r.setup,
            _fmt(r.value, r.unit),
            _fmt(r.baseline, r.unit),
            "n/a" if math.isnan(r.ratio) else f"{r.ratio:.2f}x",
            r.target,
            "" if r.met is None else ("yes" if r.met else "NO"),
            r.baseline_is,
        )
        for r in report.rows
    ]
    lines += _aligned(table, left={0, 1, 5, 6, 7})
    lines += [
        "",
        "ratio = helix / baseline: for ev/s below 1x is slower; for ms and MB above 1x is more.",
        *report.notes,
        f"total {elapsed_s:.1f} s",
    ]
    return "\n".join(lines)


def format_markdown(report: Report, *, params: dict[str, Any], elapsed_s: float) -> str:
    """The report as a Markdown table (for the README), with the machine and params."""
    info = machine()
    lines = [
        f"nproc {info['nproc']}, {info['python']}, grpcio {info['grpcio']}, "
        f"{info['platform']}, load average {info['loadavg_1m_at_end']} at the end, "
        f"{elapsed_s:.0f} s; " + ", ".join(f"{k}={v}" for k, v in params.items()),
        "",
        "| scenario | setup | helix | baseline | ratio | target | met | baseline is |",
        "|---|---|--:|--:|--:|---|---|---|",
    ]
    for r in report.rows:
        ratio = "n/a" if math.isnan(r.ratio) else f"{r.ratio:.2f}x"
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(
            f"| {r.scenario} | {r.setup} | {_fmt(r.value, r.unit)} | "
            f"{_fmt(r.baseline, r.unit)} | {ratio} | {r.target} | {met} | {r.baseline_is} |"
        )
    return "\n".join(lines)


def to_document(report: Report, *, params: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """The report as a JSON-ready document (no NaN: ``null`` where a figure is missing)."""
    document: dict[str, Any] = json_safe(
        {
            "machine": machine(),
            "params": params,
            "elapsed_s": round(elapsed_s, 2),
            "rows": [asdict(r) for r in report.rows],
            "details": report.details,
            "notes": report.notes,
        }
    )
    return document


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float ``None``: ``json.dump`` writes them as
    ``NaN``, which is not JSON (JavaScript's, Go's and jq's strict parsers refuse it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class Change:
    """One row of this run beside the same row (scenario and setup) of a saved run."""

    scenario: str
    setup: str
    measure: Literal["ratio", "value"]
    """The ratio to the same-run baseline when both runs have one (it travels across
    runs on a noisy host), else the absolute value (restart latency, say)."""
    unit: Unit
    before: float
    now: float
    change: float
    """now / before."""
    better: Literal["higher", "lower"]
    """Which way is better for this row: higher for events/s, lower for ms and MB."""


def compare(saved: dict[str, Any], report: Report) -> tuple[list[Change], list[str]]:
    """This run's rows beside the rows of ``saved`` (a document from ``--save``), and
    notes on the rows only one of the two has.

    Raises:
        ValueError: ``saved`` is not a document ``to_document`` wrote.
    """
    try:
        previous = {
            (row["scenario"], row["setup"]): (_number(row["value"]), _number(row["ratio"]))
            for row in saved["rows"]
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a saved bench run (--save): {exc!r}") from None
    changes: list[Change] = []
    matched: set[tuple[str, str]] = set()
    for row in report.rows:
        key = (row.scenario, row.setup)
        if key not in previous:
            continue
        matched.add(key)
        value, ratio = previous[key]
        by_ratio = math.isfinite(ratio) and math.isfinite(row.ratio)
        before, now = (ratio, row.ratio) if by_ratio else (value, row.value)
        changes.append(
            Change(
                scenario=row.scenario,
                setup=row.setup,
                measure="ratio" if by_ratio else "value",
                unit=row.unit,
                before=before,
                now=now,
                change=now / before if before else float("nan"),
                better="higher" if row.unit == "events/s" else "lower",
            )
        )
    notes = []
    if only_now := len(report.rows) - len(matched):
        notes.append(f"{only_now} row(s) of this run are not in the saved run")
    if only_before := len(previous) - len(matched):
        notes.append(f"{only_before} row(s) of the saved run are not in this run")
    return changes, notes


def _number(value: Any) -> float:
    """A saved figure; ``null`` (a missing one) is NaN again."""
    return float("nan") if value is None else float(value)


def format_comparison(changes: list[Change], notes: list[str], *, saved_from: str) -> str:
    """``compare``'s rows as a plain-text table."""
    lines = [
        f"compared with {saved_from} (ratios to each run's own baseline where both have one;",
        "absolute values, which follow the host's speed, otherwise)",
        "",
    ]
    header = ("scenario", "setup", "before", "now", "now/before", "better")

    def shown(c: Change, x: float) -> str:
        return f"{x:.2f}x" if c.measure == "ratio" else _fmt(x, c.unit)

    table = [header] + [
        (
            c.scenario,
            c.setup,
            shown(c, c.before),
            shown(c, c.now),
            "n/a" if math.isnan(c.change) else f"{c.change:.2f}",
            c.better,
        )
        for c in changes
    ]
    return "\n".join(lines + _aligned(table, left={0, 1, 5}) + notes)
