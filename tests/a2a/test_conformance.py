"""The conformance kit's ``a2a`` section (the official a2a-sdk client) against a helix
A2A endpoint, and against endpoints that break what it checks: a replay that drops an
event, and the a2a-sdk's own reference server (an A2A server with no helix in it)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import a2a_pb2 as a2a

from helix_transport import ServerConfig, create_server
from helix_transport.a2a import handler, server
from helix_transport.bench.a2a import reference_server
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore
from helix_transport.testing.conformance import CheckResult, format_results, run_conformance
from helix_transport.transport import ClientAuth
from tests.agents.kit_approvals import approving
from tests.helpers import ROOT

PLAIN = json.dumps({"to": "ops@example.com", "ask": False, "ticks": 10})
ASKING = json.dumps({"to": "ops@example.com"})
TOKEN = "kit-token-0123456789abcdef"
A2A_CHECKS = {
    "a2a.card",
    "a2a.stream",
    "a2a.send",
    "a2a.get_task",
    "a2a.resubscribe.ended",
    "a2a.resubscribe.from_sequence",
    "a2a.resubscribe.mid_run",
    "a2a.cancel",
    "a2a.not_found",
    "a2a.invalid_params",
    "a2a.input_required",
}


@pytest.fixture(autouse=True)
def slow_scripted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs last long enough to leave a stream mid-run and to cancel a running task."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "3")


async def _run(tmp_path: Path, **options: object) -> list[CheckResult]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} kit\n")
    config = ServerConfig(a2a_port=0)
    auth = AuthConfig(tokens_file=str(tokens))
    async with await create_server(approving, MemoryStore(), config, auth=auth) as served:
        assert served.a2a is not None
        return await run_conformance(
            served.address,
            input_json=PLAIN,
            input_required_json=ASKING,
            auth=ClientAuth(token=TOKEN),
            a2a_url=served.a2a.url,
            timeout_s=60,
            **options,  # type: ignore[arg-type]
        )


async def test_a_helix_endpoint_passes_both_sections(tmp_path: Path) -> None:
    results = await _run(tmp_path)
    by_name = {r.name: r for r in results}
    assert set(by_name) >= A2A_CHECKS and "stream.gapless" in by_name, format_results(results)
    assert all(r.passed for r in results), format_results(results)
    for name in A2A_CHECKS - {"a2a.cancel", "a2a.resubscribe.mid_run"}:
        assert not by_name[name].skipped, format_results(results)
    assert "asked 'send' (approval" in by_name["a2a.input_required"].detail


async def test_the_a2a_section_alone(tmp_path: Path) -> None:
    results = await _run(tmp_path, sections=["a2a"])
    assert {r.name for r in results} == A2A_CHECKS, format_results(results)
    with pytest.raises(ValueError, match="unknown section"):
        await run_conformance("127.0.0.1:1", input_json=PLAIN, sections=["soap"])
    with pytest.raises(ValueError, match="needs the service's A2A URL"):
        await run_conformance("127.0.0.1:1", input_json=PLAIN, sections=["a2a"])


class _DropsOnReplay(handler.HelixRequestHandler):
    """Replays a task without its second event: a resubscribing client misses it."""

    async def on_subscribe_to_task(
        self, params: a2a.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[handler.Event]:
        n = 0
        async for event in super().on_subscribe_to_task(params, context):
            n += 1
            if n != 3:  # the Task, the first update, then the one dropped
                yield event


async def test_a_replay_that_drops_an_event_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "HelixRequestHandler", _DropsOnReplay)
    results = await _run(tmp_path, sections=["a2a"])
    failed = {r.name: r.detail for r in results if not r.passed}
    assert {"a2a.resubscribe.ended", "a2a.resubscribe.mid_run"} <= set(failed), format_results(
        results
    )
    assert "no gap" in failed["a2a.resubscribe.ended"]
    assert {"a2a.stream", "a2a.get_task", "a2a.not_found"}.isdisjoint(failed)


async def test_the_sdk_reference_server_is_no_helix_endpoint() -> None:
    async with reference_server(5) as url:
        results = await run_conformance(url, input_json=PLAIN, timeout_s=30)
    failed = {r.name: r.detail for r in results if not r.passed}
    assert "a2a.card" in failed, format_results(results)
    assert "carries no metadata.helix.sequence" in failed["a2a.stream"], format_results(results)
    assert "a2a.resubscribe.mid_run" in failed, format_results(results)


async def test_cli_runs_the_a2a_section(tmp_path: Path) -> None:
    async with await create_server(
        approving, MemoryStore(), ServerConfig(a2a_port=0), allow_unauthenticated=True
    ) as served:
        assert served.a2a is not None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "helix_transport.cli", "conformance", served.a2a.url,
            "--input", PLAIN, "--input-required", ASKING,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
    assert proc.returncode == 0, out.decode() + err.decode()
    assert "PASS  a2a.resubscribe.ended" in out.decode()
    assert "stream.gapless" not in out.decode()
