"""`helix-mesh bench --quick --json` as a real process: the suite runs end to end and
its JSON has the documented shape. Figures are not checked (timing is the bench's job,
never a test's); only that each is a finite, positive measurement beside its baseline.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

ROW_KEYS = {
    "scenario", "setup", "unit", "value", "baseline", "baseline_is", "ratio", "target", "met",
}  # fmt: skip


@pytest.mark.timeout(240)
def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


async def test_quick_bench_json(tmp_path: Path) -> None:
    # An earlier run to compare with: one row this run also has, one it does not.
    saved = tmp_path / "before.json"
    saved.write_text(
        json.dumps(
            {
                "rows": [
                    {"scenario": "1 live stream, 300 events", "setup": "memory, in-process",
                     "value": 1000.0, "ratio": 2.0},
                    {"scenario": "9 retired", "setup": "", "value": 1.0, "ratio": 1.0},
                ]
            }
        )
    )  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "bench", "--quick", "--json",
        "--stores", "memory", "--scenarios", "1,2,3,4,5,7", "--compare", str(saved),
        "--log-format", "json",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    # Progress on stderr while it runs (the first line before any scenario ends),
    # results on stdout at the end: stdout stays one JSON document.
    first = json.loads(await proc.stderr.readline())
    assert first["logger"] == "helix.bench", first
    assert first["message"].startswith("scenarios 1,2,3,4,5,7;"), first
    out, rest = await proc.communicate()
    assert proc.returncode == 0, rest.decode()[-3000:]
    # Every line on stderr is JSON under --log-format json: progress and logs alike.
    lines = [json.loads(line) for line in rest.decode().splitlines()]
    progress = [line["message"] for line in lines if line["logger"] == "helix.bench"]
    for name in ("1-3 (memory)", "5", "4", "7"):
        assert f"scenario {name}: running" in progress
        assert any(p.startswith(f"scenario {name}: done in") for p in progress), progress
    document = json.loads(out, parse_constant=_not_json)  # NaN was written as is
    compared = document.pop("compared_with")
    live = next(r for r in document["rows"] if r["scenario"] == "1 live stream, 300 events")
    assert compared["rows"] == [
        {"scenario": "1 live stream, 300 events", "setup": "memory, in-process",
         "measure": "ratio", "unit": "events/s", "before": 2.0, "now": live["ratio"],
         "change": pytest.approx(live["ratio"] / 2.0), "better": "higher"},
    ]  # fmt: skip
    assert compared["notes"] == [
        f"{len(document['rows']) - 1} row(s) of this run are not in the saved run",
        "1 row(s) of the saved run are not in this run",
    ]

    assert document["machine"]["nproc"] >= 1
    assert document["params"]["events"] == 300 and document["params"]["stores"] == "memory"
    assert not [n for n in document["notes"] if "failed" in n], document["notes"]
    rows = document["rows"]
    assert all(set(row) == ROW_KEYS for row in rows)
    numbers = sorted({row["scenario"].split()[0] for row in rows})
    assert numbers == ["1", "2", "3", "4", "5", "7"]
    for row in rows:
        assert row["unit"] in ("events/s", "ms", "MB")
        assert math.isfinite(row["value"]) and row["value"] > 0, row
        assert math.isfinite(row["baseline"]) and row["baseline"] > 0, row
        assert row["ratio"] == pytest.approx(row["value"] / row["baseline"])
        # A row with a target says whether it is met; one without says nothing.
        assert (row["met"] is None) == (row["target"] == ""), row
    targeted = {row["scenario"].split()[0] for row in rows if row["target"]}
    assert targeted == {"1", "2", "3", "4", "5", "7"}
    # The fan-out's memory rows measure real processes: both services, and the floor of
    # as many processes that only import litellm and make one call.
    # The fan-out's peak above that floor is what issue 50's target bounds.
    memory = {row["scenario"].split(":")[1].strip(): row for row in rows if row["unit"] == "MB"}
    assert set(memory) == {
        "peak RSS, both services",
        "peak PSS, both services",
        "peak RSS above the litellm floor, both services",
        "2 processes that only import litellm, one call each",
    }
    peak = memory["peak RSS, both services"]
    floor = memory["2 processes that only import litellm, one call each"]
    assert peak["value"] > floor["value"] > 50
    above = memory["peak RSS above the litellm floor, both services"]
    # The first fan-out's peak (from idle), at most the highest of all rounds.
    assert 0 < above["value"] + floor["value"] <= peak["value"] + 1e-6
    assert above["target"] and above["met"] == (above["value"] <= 64)


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_bench_rejects_unknown_scenario(log_format: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "bench", "--scenarios", "42",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HELIX_LOG_FORMAT": log_format},
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 2
    if log_format == "text":
        assert err.decode() == "helix-mesh bench: unknown scenario or store ['42']\n"
    else:  # the format a collector was told to expect, for this line too
        (line,) = [json.loads(line) for line in err.decode().splitlines()]
        assert line["level"] == "ERROR" and line["logger"] == "helix.bench"
        assert line["message"] == "unknown scenario or store ['42']"


async def test_bench_refuses_a_bad_comparison_file_before_running(tmp_path: Path) -> None:
    for content, problem in (("", "Expecting value"), ('{"rows": [{}]}', "not a saved bench run")):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "helix_transport.cli", "bench", "--compare", str(bad),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 2 and not out, err.decode()
        assert f"--compare {bad}: " in err.decode() and problem in err.decode()


def test_comparison_uses_ratios_and_falls_back_to_values() -> None:
    from helix_transport.bench._report import (
        Report,
        compare,
        format_comparison,
        json_safe,
        to_document,
    )

    report = Report()
    report.add("3 round trip p50", "sqlite", "ms", 12.0, 1.0, "raw")
    report.add("8 restart p50", "sqlite", "ms", 4.0, float("nan"), "none")
    saved = {
        "rows": [
            {"scenario": "3 round trip p50", "setup": "sqlite", "value": 30.0, "ratio": 15.0},
            {"scenario": "8 restart p50", "setup": "sqlite", "value": 8.0, "ratio": float("nan")},
        ]
    }
    changes, notes = compare(saved, report)
    assert compare(json_safe(saved), report) == (changes, notes)  # a null ratio, as saved
    # The restart row has no baseline: its ratio is null in the JSON, never NaN.
    document = json.loads(json.dumps(to_document(report, params={}, elapsed_s=0), allow_nan=False))
    assert document["rows"][1]["ratio"] is None
    assert [(c.measure, c.before, c.now, c.change, c.better) for c in changes] == [
        ("ratio", 15.0, 12.0, 0.8, "lower"),
        ("value", 8.0, 4.0, 0.5, "lower"),
    ]
    assert notes == []
    text = format_comparison(changes, notes, saved_from="before.json")
    *_, ratio_row, value_row = [line.split() for line in text.splitlines()]
    assert ratio_row[-4:] == ["15.00x", "12.00x", "0.80", "lower"]
    assert value_row[-6:] == ["8.00", "ms", "4.00", "ms", "0.50", "lower"]


def test_bench_parses_a_list_of_loads() -> None:
    from helix_transport.bench._main import _parser

    args = _parser().parse_args(["--concurrent-fewer", "100,250", "--events", "7"])
    assert args.concurrent_fewer == (100, 250) and args.events == 7
    assert _parser().parse_args(["--concurrent-fewer", ""]).concurrent_fewer == ()
    with pytest.raises(SystemExit):
        _parser().parse_args(["--concurrent-fewer", "a,b"])


def test_scenario_6_timeline_says_where_in_the_run_latency_was() -> None:
    from helix_transport.bench.concurrency import _Latencies

    latencies = _Latencies(2)
    latencies.samples = [(100.1, 10.0), (100.3, 20.0), (100.35, 40.0), (101.0, 5.0)]
    latencies.all_streaming, latencies.first_done = 100.3, 100.9
    timeline = latencies.timeline(100.0)
    assert timeline["all_streaming_s"] == pytest.approx(0.3)
    assert timeline["first_end_s"] == pytest.approx(0.9)
    assert [(b["from_s"], b["events"], b["p99_ms"]) for b in timeline["bins"]] == [
        (0.0, 1, 10.0),
        (0.25, 2, pytest.approx(39.8)),
        (1.0, 1, 5.0),
    ]
    assert _Latencies(1).timeline(0.0) == {"all_streaming_s": None, "first_end_s": None, "bins": []}


def test_scenario_6_poisson_arrivals_keep_as_many_sessions_streaming_on_average() -> None:
    from helix_transport.bench.concurrency import _Latencies, poisson_arrivals

    arrivals = poisson_arrivals(500, 10.0)
    assert arrivals == poisson_arrivals(500, 10.0)  # seeded: every run offers the same
    assert len(arrivals) == 1000 and arrivals == sorted(arrivals) and arrivals[0] > 0
    # 50 starts/s: the 1,000th comes about 20 s in (a Poisson process's spread, not exact).
    assert 18.0 < arrivals[-1] < 22.0
    # Little's law: at the middle arrival on, about 500 sessions of 10 s are streaming.
    middle = arrivals[500]
    assert 450 < sum(1 for at in arrivals if middle - 10.0 < at <= middle) < 550
    latencies = _Latencies(1000)
    latencies.samples = [(100.0 + at, at) for at in (1.0, middle + 0.5, arrivals[-1] + 1)]
    assert latencies.between(100.0, arrivals) == [middle + 0.5]
    assert latencies.between(100.0, []) == []
