"""Service logs: ``--log-format json`` is one JSON object per line, with the session's
context, stdout's announcements included; a failed session says why at WARNING, with its
``status``, ``reason`` and ``error`` as fields; an RPC's lines name its session; no secret
reaches the log, nor the session's stored error that ``GetStatus`` returns.

The process test serves ``tests.agents.failing:refused``, whose provider refuses the
call and echoes the API key back in its error (as some providers do), behind a token
file; the client presents its bearer token and sends message content; the log holds
the failure reason, and neither the key, nor the token, nor the content.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.trace import Span, Tracer

from helix_transport import AgentClient, create_server
from helix_transport._exceptions import RemoteError
from helix_transport.server import _logging
from helix_transport.server.app import configure_logging
from helix_transport.store import MemoryStore, SessionRecord
from helix_transport.testing.processes import ServiceProcess, free_port
from helix_transport.transport import ClientAuth
from tests.agents import failing
from tests.helpers import ROOT


async def test_a_failed_session_in_json_logs_says_why_and_leaks_nothing(tmp_path: Path) -> None:
    api_key = f"sk-planted-{secrets.token_hex(16)}"
    token = secrets.token_urlsafe(24)
    (tokens := tmp_path / "tokens").write_text(f"{token} alice acme\n")
    content = f"the private question {secrets.token_hex(8)}"
    log = tmp_path / "refused.log"
    service = ServiceProcess(
        "tests.agents.failing:refused",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'refused.db'}",
        log_path=log,
        cwd=ROOT,
        auth_args=["--auth-tokens", str(tokens)],
        extra_args=["--log-format", "json", "--metrics-port", "0"],
        health_port=(health_port := free_port()),
        env={"OPENAI_API_KEY": api_key, "HELIX_LOG_LEVEL": "INFO"},
    )
    await service.start()
    try:
        async with await AgentClient.connect(
            service.address, auth=ClientAuth(token=token)
        ) as client:
            await client.start(json.dumps({"text": content}), session_id="leaky-1")
            events = [e async for e in client.stream("leaky-1")]
            status = await client.get_status("leaky-1")
        assert events[-1].WhichOneof("payload") == "failed"
        assert status.failure_reason  # what the log must say too
        assert await service.stop() == 0  # SIGTERM: drained and exited cleanly
    finally:
        await service.stop()

    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    # Every line is JSON, stdout's announcements (listening, metrics, health) included.
    records = [json.loads(line) for line in lines]
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    announced = {r["message"].split(" on ")[0]: r for r in records if " on " in r["message"]}
    assert announced["metrics"]["metrics_url"].startswith("http://127.0.0.1:")
    assert announced["agent 'refused' listening"]["address"] == service.address
    assert announced["health"]["health_address"] == f"127.0.0.1:{health_port}"
    failed = [r for r in records if r["level"] == "WARNING" and "failed (" in r["message"]]
    assert len(failed) == 1, records
    (line,) = failed
    assert line["logger"] == "helix.loop"
    assert line["agent_type"] == "refused"
    assert line["session_id"].endswith("/leaky-1")  # alice's namespace, then her id
    assert f"({status.failure_reason})" in line["message"]
    assert "Incorrect API key provided: [redacted]" in line["message"]
    # What a machine filters on, as fields of their own.
    assert line["status"] == "failed"
    assert line["reason"] == status.failure_reason
    assert line["error"] == status.error
    assert status.error.endswith("Incorrect API key provided: [redacted]")
    (ended,) = [r for r in records if r["message"].endswith("ended failed")]
    assert ended["status"] == "failed" and ended["session_id"] == line["session_id"]
    for secret in (api_key, token, content):
        assert secret not in text
        assert secret not in status.error  # what GetStatus returns was stored redacted


async def test_an_rpc_log_line_names_the_session_it_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A store that breaks under a GetStatus: the interceptor logs the unhandled error.
    class Broken(MemoryStore):
        async def get_session(self, session_id: str) -> SessionRecord | None:
            raise RuntimeError("disk on fire")

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("json")
        async with (
            await create_server(failing.refused, Broken(), allow_unauthenticated=True) as server,
            await AgentClient.connect(server.address) as client,
        ):
            with pytest.raises(RemoteError):
                await client.get_status("rpc-7")
        err = capsys.readouterr().err
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    (line,) = [r for r in records if r["message"].startswith("unhandled error in")]
    assert line["session_id"] == "rpc-7"  # anonymous: the bare id is the key
    assert line["rpc"] == "/helix.agent.v1.AgentService/GetStatus"
    assert "disk on fire" in line["exc_info"]


def test_an_unexpected_exception_is_one_json_line_with_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-planted-0123456789")
    tracer = TracerProvider().get_tracer("test")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("json")
        # In a context of its own, as a run's task: the binding ends with it.
        span = contextvars.copy_context().run(_crash_in_a_run, tracer)
        # The handler writes to the stderr of when it was made: pytest's capture.
        err = capsys.readouterr().err
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    (line,) = [line for line in err.splitlines() if line.strip()]
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["session_id"] == "s-42"
    assert record["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert record["exc_info"].startswith("Traceback (most recent call last)")
    assert "RuntimeError: boom with [redacted] inside" in record["exc_info"]
    assert "tok-planted" not in line


def _crash_in_a_run(tracer: Tracer) -> Span:
    _logging.bind(session_id="s-42")
    with tracer.start_as_current_span("run") as span:  # what a traced run's task has
        try:
            raise RuntimeError("boom with tok-planted-0123456789 inside")
        except RuntimeError:
            logging.getLogger("helix.runner").exception("session %s: run loop crashed", "s-42")
    return span


def test_an_unknown_log_format_is_a_usage_error() -> None:
    from helix_transport._exceptions import UsageError

    with pytest.raises(UsageError, match="HELIX_LOG_FORMAT"):
        configure_logging("yaml")


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--log-format", "json"], {}), ([], {"HELIX_LOG_FORMAT": "json"}), ([], {})],
    ids=["flag", "variable", "text"],
)
def test_serve_s_fatal_error_is_a_json_line_when_json_was_asked_for(
    args: list[str], env: dict[str, str]
) -> None:
    # A collector told to parse every line as JSON lost the one that said why it ended.
    environ = {k: v for k, v in os.environ.items() if k != "HELIX_LOG_FORMAT"}
    done = subprocess.run(
        [sys.executable, "-m", "helix_transport.cli", "serve", "no_such_module:agent", *args],
        cwd=ROOT, env={**environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    why = "cannot import 'no_such_module': No module named 'no_such_module'"
    if not args and not env:
        assert done.stderr == f"helix-mesh: {why}\n"
        return
    (line,) = [json.loads(line) for line in done.stderr.splitlines()]
    assert line["level"] == "ERROR" and line["logger"] == "helix.cli"
    assert line["message"] == why and line["exit_code"] == 2
