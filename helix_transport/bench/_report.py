"""Benchmark rows, their targets, and the table and JSON they print as."""

from __future__ import annotations

import math
import os
import platform
import statistics
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
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    left = {0, 1, 5, 6, 7}
    for i, line in enumerate(table):
        cells = [
            c.ljust(w) if j in left else c.rjust(w)
            for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
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
    """The report as a JSON-ready document."""
    return {
        "machine": machine(),
        "params": params,
        "elapsed_s": round(elapsed_s, 2),
        "rows": [asdict(r) for r in report.rows],
        "details": report.details,
        "notes": report.notes,
    }
