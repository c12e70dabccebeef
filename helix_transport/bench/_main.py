"""``helix-mesh bench``: argument parsing and the order scenarios run in."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helix_transport.bench._report import (
    Report,
    Row,
    compare,
    format_comparison,
    format_markdown,
    format_table,
    json_safe,
    to_document,
)

if TYPE_CHECKING:
    from helix_transport.bench._measure import Ids

SCENARIOS = ("1", "2", "3", "4", "5", "6", "7", "8", "10", "11")

logger = logging.getLogger("helix.bench")
_json_lines: list[bool] = []
"""Set by ``_configure_logging``: whether lines on stderr are JSON."""


@dataclass(frozen=True, kw_only=True)
class Params:
    """Sizes of one run (the issue's by default, tiny with ``--quick``)."""

    events: int = 10_000
    """1, 2 and 4: events per stream."""
    sessions: int = 500
    """3: sequential round trips."""
    repeat: int = 3
    """1, 2, 4, 5: timed runs per figure (median)."""
    delegations: int = 100
    """4: sequential delegations beside as many local tool calls."""
    children: int = 1_000
    """5: fan-out width."""
    concurrent: int = 500
    """6: sessions streaming at once."""
    concurrent_events: int = 200
    """6: events per session (long enough that all sessions stream at once)."""
    concurrent_pace_ms: float = 50.0
    """6: pause between two events of one session (a 20-token/s model stream)."""
    concurrent_fewer: tuple[int, ...] = (100, 250)
    """6: lighter loads (sessions at once) whose p99 is reported beside the full one."""
    interrupts: int = 20
    """7: timed interrupts."""
    recoveries: int = 3
    """8: kills per variant."""


QUICK = Params(
    events=300,
    sessions=10,
    repeat=1,
    delegations=3,
    children=10,
    concurrent=10,
    concurrent_events=5,
    concurrent_pace_ms=10,
    concurrent_fewer=(),
    interrupts=2,
    recoveries=1,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="helix-mesh bench",
        description=(__import__("helix_transport.bench").bench.__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=(
            "comma-separated scenario numbers, 1-8, 10 (A2A) and 11 (limit checks) "
            "(default all; 1-3 run together)"
        ),
    )
    parser.add_argument(
        "--stores",
        default="memory,sqlite",
        help="backends for 1-3: memory, sqlite, redis, postgres (default memory,sqlite)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--save", default="", help="also write the JSON document to this file")
    parser.add_argument(
        "--compare",
        default="",
        metavar="FILE",
        help="print each row beside the same row of a run saved with --save",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="stderr's lines (progress, logs) as text, or one JSON object per line, as "
        "serve's (default $HELIX_LOG_FORMAT, else text)",
    )
    parser.add_argument(
        "--metrics",
        choices=("off", "on", "both"),
        default="off",
        help="1-3 with metrics recorded (a /metrics endpoint on a free port), or each "
        "store once without and once with them, rows marked 'metrics on' (default off)",
    )
    for name, default in Params().__dict__.items():
        flag = "--" + name.replace("_", "-")
        kind = _int_list if isinstance(default, tuple) else type(default)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        parser.add_argument(flag, type=kind, default=None, help=f"(default {shown})")
    return parser


def _int_list(text: str) -> tuple[int, ...]:
    """``100,250`` -> ``(100, 250)``; an empty string is no values."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected scenarios and print the table (or JSON); 0 unless one crashed."""
    args = _parser().parse_args(argv)
    if (problem := _configure_logging(args.log_format)) is not None:
        print(f"helix-mesh bench: {problem}", file=sys.stderr)
        return 2
    base = QUICK if args.quick else Params()
    overrides = {k: getattr(args, k) for k in base.__dict__ if getattr(args, k) is not None}
    params = Params(**{**base.__dict__, **overrides})
    scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    from helix_transport.bench.streams import STORES

    if unknown := (scenarios - set(SCENARIOS)) | (set(stores) - set(STORES)):
        fatal(f"unknown scenario or store {sorted(unknown)}")
        return 2
    saved = None
    if args.compare:  # read now: a bad file should not cost a whole run
        try:
            with open(args.compare) as f:
                saved = json.load(f)
            compare(saved, Report())
        except (OSError, ValueError) as exc:
            fatal(f"--compare {args.compare}: {exc}")
            return 2
    progress(f"scenarios {','.join(sorted(scenarios))}; results when all have run")
    started = time.perf_counter()
    report = Report()
    failed = asyncio.run(_run(report, params, scenarios, stores, metrics=args.metrics))
    elapsed = time.perf_counter() - started
    shown: dict[str, Any] = {
        **params.__dict__,
        "scenarios": ",".join(sorted(scenarios)),
        "stores": ",".join(stores),
    }
    document = to_document(report, params=shown, elapsed_s=elapsed)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(document, f, indent=2, allow_nan=False)
    changes, notes = compare(saved, report) if saved is not None else ([], [])
    if args.json:
        if saved is not None:
            document["compared_with"] = json_safe(
                {"file": args.compare, "rows": [asdict(c) for c in changes], "notes": notes}
            )
        json.dump(document, sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        form = format_markdown if args.markdown else format_table
        print(form(report, params=shown, elapsed_s=elapsed))
        if saved is not None:
            print("\n" + format_comparison(changes, notes, saved_from=args.compare))
    return 1 if failed else 0


async def _run(
    report: Report, params: Params, scenarios: set[str], stores: list[str], *, metrics: str
) -> bool:
    """Run each selected scenario; one that crashes is noted and the rest still run."""
    from helix_transport.bench import concurrency, recovery, streams
    from helix_transport.bench._measure import Ids

    ids = Ids()
    failed = False
    # Service processes inherit gc.freeze from `serve`; this process freezes its own
    # long-lived imports too, so a full collection does not walk them mid-measurement.
    gc.collect()
    gc.freeze()
    with tempfile.TemporaryDirectory(prefix="helix-bench-") as tmp:
        workdir = Path(tmp)
        if scenarios & {"1", "2", "3"}:
            modes = {"off": (False,), "on": (True,), "both": (False, True)}[metrics]
            for store, metered in ((s, m) for s in stores for m in modes):
                first = len(report.rows)
                with _metrics(metered):
                    failed |= await _attempt(
                        report,
                        f"1-3 ({store})",
                        streams.single_stream(
                            report,
                            store,
                            workdir,
                            ids,
                            events=params.events,
                            sessions=params.sessions,
                            repeat=params.repeat,
                        ),
                    )
                if metered:
                    report.rows[first:] = [
                        replace(row, setup=f"{row.setup}, metrics on")
                        for row in report.rows[first:]
                    ]
        if "3" in scenarios:  # issue 50's target 3, once per run (memory store)
            from helix_transport.bench.small_call import small_call

            calls = small_call(report, workdir, ids, calls=params.sessions)
            failed |= await _attempt(report, "3 small call", calls)
        if scenarios & {"4", "5", "7"}:
            failed |= await _run_delegation(report, params, scenarios, workdir, ids)
        if "6" in scenarios:
            failed |= await _attempt(
                report,
                "6",
                concurrency.concurrency(
                    report,
                    workdir,
                    ids,
                    sessions=params.concurrent,
                    events=params.concurrent_events,
                    pace_ms=params.concurrent_pace_ms,
                    fewer=params.concurrent_fewer,
                ),
            )
        if "8" in scenarios:
            for name, scenario in (("restart", recovery.restart), ("takeover", recovery.takeover)):
                measured = scenario(report, workdir, ids, runs=params.recoveries)
                failed |= await _attempt(report, f"8 {name}", measured)
        if "10" in scenarios:
            from helix_transport.bench import a2a

            streaming = a2a.a2a_streams(
                report, workdir, ids, events=min(params.events, 3000), repeat=params.repeat
            )
            failed |= await _attempt(report, "10", streaming)
        if "11" in scenarios:
            from helix_transport.bench import limits_check

            checking = limits_check.limit_check(report, ids, repeat=params.repeat)
            failed |= await _attempt(report, "11", checking)
    report.rows.sort(key=lambda r: r.scenario.split(" ")[0])  # stable: setups keep order
    return failed


async def _run_delegation(
    report: Report, params: Params, scenarios: set[str], workdir: Path, ids: Ids
) -> bool:
    """Scenarios 4, 5 and 7 against one chain of service processes; True if one crashed."""
    from helix_transport.bench import delegation

    failed = False
    services = delegation.Services(workdir / "chain")
    (workdir / "chain").mkdir()
    delegation.chain(services)
    try:
        await services.start(*services.procs)
        if "5" in scenarios:  # first, so the services' memory growth is its own
            failed |= await _attempt(
                report,
                "5",
                delegation.fan_out(
                    report, services, ids, children=params.children, repeat=params.repeat
                ),
            )
        if "4" in scenarios:
            failed |= await _attempt(
                report,
                "4",
                delegation.two_hops(
                    report,
                    services,
                    ids,
                    events=params.events,
                    sessions=params.delegations,
                    repeat=params.repeat,
                ),
            )
        if "7" in scenarios:
            failed |= await _attempt(
                report,
                "7",
                delegation.interrupt_latency(report, services, ids, runs=params.interrupts),
            )
    finally:
        await services.stop()
        report.notes += services.logged_problems()[:10]
    return failed


@contextlib.contextmanager
def _metrics(on: bool) -> Iterator[None]:
    """Metrics recorded (and served, as ``serve --metrics-port`` does) while it lasts."""
    if not on:
        yield
        return
    from helix_transport.metrics import MetricsConfig, start_metrics

    endpoint = start_metrics(MetricsConfig(port=0, service_name="bench"))
    try:
        yield
    finally:
        endpoint.shutdown()


def _configure_logging(log_format: str | None) -> str | None:
    """Log as ``serve`` does (its formatter, secrets redacted), on stderr, at
    ``$HELIX_LOG_LEVEL``, else WARNING (the in-process services' INFO lines would
    drown the progress); the problem when the format is unknown, else None."""
    from helix_transport._exceptions import UsageError
    from helix_transport.config import Environment
    from helix_transport.server.app import configure_logging

    env = Environment()
    chosen = (log_format or env.log_format() or "text").lower()
    try:
        configure_logging(chosen)
    except UsageError as exc:
        return str(exc)
    logging.getLogger().setLevel(env.get("HELIX_LOG_LEVEL").upper() or logging.WARNING)
    logger.setLevel(logging.INFO)  # progress, whatever the level
    _json_lines[:] = [chosen == "json"]
    return None


def progress(text: str) -> None:
    """One line of progress on standard error: standard output keeps only the results
    (a table, or the JSON document), which come at the end. ``helix-mesh bench: text``,
    or a JSON line (logger ``helix.bench``) under ``--log-format json``."""
    if _json_lines and _json_lines[0]:
        logger.info(text)
    else:
        print(f"helix-mesh bench: {text}", file=sys.stderr, flush=True)


def fatal(text: str) -> None:
    """Why the bench does not run, on standard error, as ``progress`` says things."""
    if _json_lines and _json_lines[0]:
        logger.error(text)
    else:
        print(f"helix-mesh bench: {text}", file=sys.stderr, flush=True)


async def _attempt(report: Report, name: str, scenario: Awaitable[object]) -> bool:
    """Await one scenario, saying on stderr when it starts and ends; a crash is noted
    (and True returned), not raised."""
    started = time.perf_counter()
    rows = len(report.rows)
    progress(f"scenario {name}: running")
    try:
        await scenario
        took = time.perf_counter() - started
        progress(f"scenario {name}: done in {took:.1f} s ({len(report.rows) - rows} rows)")
    except Exception as exc:
        progress(f"scenario {name}: failed after {time.perf_counter() - started:.1f} s")
        problem = f"{type(exc).__name__}: {exc}"
        report.notes.append(f"scenario {name} failed: {problem}")
        # A row too, so the table cannot read as if the scenario was never asked for.
        nan = float("nan")
        report.rows.append(
            Row(
                scenario=f"{name} FAILED: {problem[:100]}",
                setup="",
                unit="ms",
                value=nan,
                baseline=nan,
                baseline_is="",
                ratio=nan,
                target="completes",
                met=False,
            )
        )
        return True
    return False
