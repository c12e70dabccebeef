"""One CLI: one duration grammar, ``--json`` on every command with one vocabulary and
one time precision, one step count, and the exit-code table of docs/cli.md obeyed by
every command (a walk over the parser's commands, so a new one cannot slip by).

The commands run in-process (``main()`` in a thread: it runs its own event loop) against
servers on 127.0.0.1 in the test's loop; ``tests/cli/test_cli.py`` runs them as processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helix_transport import AgentClient, create_server
from helix_transport.cli.durations import parse_duration
from helix_transport.cli.exits import ExitCode
from helix_transport.cli.jsonout import message_json
from helix_transport.cli.main import _parser, main
from helix_transport.server import AgentServer
from helix_transport.store import MemoryStore
from helix_transport.tree import rfc3339
from tests.agents import counter
from tests.agents.approvals import mailer

_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


async def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``helix-mesh ARGV`` in-process: its exit code, stdout and stderr."""
    capsys.readouterr()

    def run() -> int:
        try:
            return main(list(argv))
        except SystemExit as exc:  # argparse's refusal
            return int(exc.code or 0)

    code = await asyncio.to_thread(run)
    out, err = capsys.readouterr()
    return code, out, err


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.fixture
async def server() -> AsyncIterator[AgentServer]:
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as served:
        yield served


# -- durations -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("1h30m", 5400), ("1h 30m", 5400), ("1.5h", 5400),
     ("500ms", 0.5), ("7d", 604800), ("2w", 1209600), ("0", 0), ("1m30s", 90)],
)  # fmt: skip
def test_one_grammar_of_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "1h30", "-5", "nan", "1x", "h", "1e400s"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_duration(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "sqlite:///x.db", "--retention", "1h30m"],
        ["sessions", "127.0.0.1:1", "--since", "1h30m"],
        ["status", "127.0.0.1:1", "s", "--wait", "1m30s"],
        ["call", "127.0.0.1:1", "--timeout", "1m30s"],
        ["conformance", "127.0.0.1:1", "--input", "{}", "--timeout", "1m30s"],
        ["serve", "m:a", "--lease-ttl", "1m30s", "--reconnect-deadline", "1m30s"],
    ],
)
def test_every_duration_flag_takes_the_same_grammar(argv: list[str]) -> None:
    # `gc --retention 1h30m` was refused while `sessions --since 1h30m` was accepted.
    _parser().parse_args(argv)


# -- --json, its vocabulary and its times ---------------------------------------------

SERVERS = {"serve", "inspect"}
"""Commands that run until stopped (their output is a log or a page, not a result)."""


def test_every_command_that_answers_has_json() -> None:
    from helix_transport.bench._main import _parser as bench_parser

    commands = _commands()
    for name, parser in commands.items():
        if name in SERVERS or name == "bench":
            continue
        flags = {flag for action in parser._actions for flag in action.option_strings}
        assert "--json" in flags, f"{name} has no --json"
    bench_flags = {flag for action in bench_parser()._actions for flag in action.option_strings}
    assert "--json" in bench_flags


def test_every_time_is_rfc_3339_at_one_precision() -> None:
    from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

    status = pb.GetStatusResponse(session_id="s")
    status.created_at.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC))
    status.finished_at.FromDatetime(datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC))
    shown = message_json(status)
    # protobuf writes 0, 3, 6 or 9 digits as the value needs; the tree wrote 6 or none.
    assert shown["created_at"] == "2026-01-02T03:04:05.123456Z"
    assert shown["finished_at"] == "2026-01-02T03:04:06.000000Z"
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)) == shown["finished_at"]


async def test_status_and_tree_count_the_same_steps_under_the_same_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A session suspended in its first step: `status` said "steps 0" and `tree` "1 step".
    async with await create_server(mailer, MemoryStore(), allow_unauthenticated=True) as served:
        async with await AgentClient.connect(served.address) as client:
            await client.start(json.dumps({"to": "ana@example.com"}), session_id="m1")
            async with asyncio.timeout(30):
                async for event in client.stream("m1"):
                    if event.WhichOneof("payload") == "suspended":
                        break
        code, out, _ = await _run(capsys, "status", served.address, "m1", "--json")
        status = json.loads(out)
        assert code == ExitCode.RUNNING and status["status"] == "suspended"
        code, out, _ = await _run(capsys, "tree", served.address, "m1", "--json")
        tree = json.loads(out)
        assert code == ExitCode.RUNNING and "steps" not in tree
        assert tree["step_count"] == status["step_count"] == 0  # step 1 is not over
        assert _RFC3339.fullmatch(tree["started_at"]) and _RFC3339.fullmatch(status["created_at"])
        _, text, _ = await _run(capsys, "status", served.address, "m1")
        _, drawn, _ = await _run(capsys, "tree", served.address, "m1")
        assert "0 steps completed" in text and "0 steps completed" in drawn


# -- the exit-code table, walked over every command -----------------------------------


async def test_every_command_obeys_the_exit_code_table(
    server: AgentServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    address = server.address
    missing_db = tmp_path / "missing.db"
    # What each command must exit with, per docs/cli.md: a wrong request is 2 (usage),
    # one the command could do is 0, a session not ended is 5.
    walk: dict[str, list[tuple[list[str], ExitCode]]] = {
        "serve": [(["serve", "tests.agents:counter", "--store", "ftp://x"], ExitCode.USAGE)],
        "call": [
            (["call", address, "--input", "{not json"], ExitCode.USAGE),
            (["call", address, "--follow", "--session-id", "nope"], ExitCode.USAGE),
            (["call", address, "--input", '{"steps": 1}', "--json"], ExitCode.COMPLETED),
        ],
        "status": [(["status", address, "nope", "--json"], ExitCode.USAGE)],
        "interrupt": [(["interrupt", address, "nope", "--json"], ExitCode.USAGE)],
        "respond": [(["respond", address, "nope", "r", "--approve", "--json"], ExitCode.USAGE)],
        "describe": [(["describe", address, "--json"], ExitCode.COMPLETED)],
        "tree": [(["tree", address, "nope", "--json"], ExitCode.USAGE)],
        "inspect": [(["inspect", address, "--port", "x"], ExitCode.USAGE)],
        "conformance": [(["conformance", address, "--input", "{not json"], ExitCode.USAGE)],
        "gc": [
            # Refused credentials (no admin): docs say 2; it was 1.
            (["gc", address, "--retention", "1h", "--json"], ExitCode.USAGE),
            (["gc", f"sqlite:///{missing_db}", "--retention", "1h", "--dry-run"], ExitCode.USAGE),
        ],
        "sessions": [(["sessions", address, "--json"], ExitCode.COMPLETED)],
        "bench": [(["bench", "--scenarios", "99"], ExitCode.USAGE)],
        "proto": [(["proto", "--out", str(tmp_path / "proto"), "--json"], ExitCode.COMPLETED)],
    }
    assert set(walk) == set(_commands()), "a command the walk does not cover"
    for name in walk:
        cases = [*walk[name], ([name, "--no-such-flag"], ExitCode.USAGE)]
        for argv, expected in cases:
            code, out, err = await _run(capsys, *argv)
            assert code == expected, (argv, code, out, err)
            if code != ExitCode.COMPLETED:
                assert "Traceback" not in err, (argv, err)
            elif "--json" in argv:
                json.loads(out.splitlines()[-1] if name == "call" else out)
    # `gc sqlite:///missing.db --dry-run` created the file and exited 0.
    assert not missing_db.exists()


async def test_json_of_the_commands_that_had_none(
    server: AgentServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    address = server.address
    code, _, _ = await _run(
        capsys, "call", address, "--input", '{"steps": 1}', "--session-id", "j1"
    )
    assert code == ExitCode.COMPLETED
    code, out, _ = await _run(capsys, "interrupt", address, "j1", "--json")
    assert code == ExitCode.COMPLETED
    assert json.loads(out) == {
        "session_id": "j1", "abort": False, "status": "completed", "accepted": False,
    }  # fmt: skip

    from helix_transport.store import SqliteStore

    db = tmp_path / "helix.db"
    async with await SqliteStore.open(str(db)):
        pass
    code, out, _ = await _run(
        capsys, "gc", f"sqlite:///{db}", "--retention", "1h30m", "--dry-run", "--json"
    )
    assert code == ExitCode.COMPLETED
    assert json.loads(out) == {
        "target": f"sqlite:///{db}", "dry_run": True, "retention": 5400.0,
        "expired_session_ids": [],
    }  # fmt: skip


def test_help_points_to_pages_that_exist() -> None:
    from tests.helpers import ROOT

    for name, parser in _commands().items():
        for pointer in re.findall(r"see (docs/[\w-]+\.md)", parser.format_help()):
            assert (ROOT / pointer).exists(), (name, pointer)
        assert "see README" not in parser.format_help(), name
