"""At most once, by declaration: a service in a real process, SIGKILLed while a step's
tools run, then restarted on the same port and store.

The agent (``tests.agents.once``) calls a ``once`` tool (``pay``) and an ordinary one
(``note``) in one step; each records its every run in a file, which is how the test
knows a tool is running and counts runs across the crash. Two moments:

- ``pay`` cut off mid-run (it blocks): the resumed step never runs it again; the model
  gets an error result saying its outcome is unknown, and the log an ``error`` event
  with code ``outcome_unknown``. ``note``, which had returned, runs again (the rule of
  ordinary tools: the step's results were not checkpointed).
- ``pay`` returned, ``note`` still running (it blocks): ``pay``'s result was durable in
  the log when it returned, so the resumed step uses it, never runs ``pay`` again and
  never calls it unknown; ``note`` runs again.

Both keep the idempotency key of each call across the crash. SQLite for both moments,
PostgreSQL for one.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.bench.streams import drop_store_data, store_url
from tests.agents.once import runs
from tests.helpers import ROOT, ServiceProcess, free_port


@dataclass
class Service:
    process: ServiceProcess
    runs_log: Path

    def runs(self, session_id: str, tool_name: str) -> list[dict[str, object]]:
        return runs(self.runs_log, session_id, tool_name)


@pytest.fixture
async def service(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Service]:
    store_name: str = request.param
    if store_name == "postgres":
        request.getfixturevalue("postgres_dsn")  # fails under CI=true without PostgreSQL
    url = store_url(store_name, tmp_path, label="_once")
    runs_log = tmp_path / "runs.log"
    process = ServiceProcess(
        "tests.agents.once:payer",
        port=free_port(),
        store_url=url,
        log_path=tmp_path / "payer.log",
        env={"HELIX_TEST_RUNS_LOG": str(runs_log)},
        extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
        cwd=ROOT,
    )
    await process.start()
    try:
        yield Service(process, runs_log)
    finally:
        await process.stop()
        await drop_store_data(store_name, url)


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


async def until_both_ran(service: Service, session_id: str) -> None:
    """Until both tools have recorded a run (the file is another process's: polled)."""
    async with asyncio.timeout(60):
        while not (service.runs(session_id, "pay") and service.runs(session_id, "note")):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def logged_tool_end(client: AgentClient, session_id: str, call_id: str) -> None:
    """Until the session's log holds ``call_id``'s ``tool_end`` (a stream sends only
    what the store has)."""
    async with asyncio.timeout(60):
        async for event in client.stream(session_id):
            if kind(event) == "tool_end" and event.tool_end.tool_call_id == call_id:
                return


async def finished(client: AgentClient, session_id: str) -> list[pb.StreamEvent]:
    """The session's whole log once it completed (retrying while the service restarts)."""
    async with asyncio.timeout(90):
        while True:
            try:
                status = await client.get_status(session_id, wait=timedelta(seconds=20))
            except Exception:
                await asyncio.sleep(0.2)
                continue
            if status.status == pb.SESSION_STATUS_COMPLETED:
                break
            assert status.status == pb.SESSION_STATUS_RUNNING, status
    return [e async for e in client.stream(session_id)]


def tool_ends(events: list[pb.StreamEvent], call_id: str) -> list[pb.ToolEnd]:
    return [
        e.tool_end for e in events if kind(e) == "tool_end" and e.tool_end.tool_call_id == call_id
    ]


async def crash_while(service: Service, block: str) -> tuple[str, list[pb.StreamEvent]]:
    """Start a session whose ``block`` tool blocks, SIGKILL the service once both tools
    have run (and, when ``pay`` returned, its result is in the log), restart it, and
    return the session's id and its whole log once it completed."""
    session_id = f"once-{block}-{uuid.uuid4().hex[:6]}"
    process = service.process
    async with await AgentClient.connect(process.address) as client:
        await client.start(json.dumps({"block": block}), session_id=session_id)
        await until_both_ran(service, session_id)
        if block == "note":  # pay returned: its result is durable before the kill
            await logged_tool_end(client, session_id, "call_pay")
        await process.kill()
        await process.start()
        events = await finished(client, session_id)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1)), "gap or repeat"
    assert sum(kind(e) == "run_resumed" for e in events) == 1
    return session_id, events


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", ["sqlite", "postgres"], indirect=True)
async def test_a_once_tool_cut_off_mid_run_never_runs_twice(service: Service) -> None:
    session_id, events = await crash_while(service, "pay")
    assert len(service.runs(session_id, "pay")) == 1, "the once tool ran twice"
    assert len(service.runs(session_id, "note")) == 2, "the ordinary tool did not run again"
    # The model was told, with the call's id; the operator sees the code.
    (unknown,) = tool_ends(events, "call_pay")
    assert unknown.is_error and "outcome is unknown" in unknown.result_json
    codes = [e.error for e in events if kind(e) == "error"]
    assert [c.code for c in codes] == ["outcome_unknown"]
    assert "call_pay" in codes[0].message
    output = json.loads(events[-1].completed.output_json)["result"]
    assert "outcome is unknown" in output["pay"]["error"]
    note_keys = {r["key"] for r in service.runs(session_id, "note")}
    assert note_keys == {output["note"]["key"]}, "the idempotency key changed across the crash"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", ["sqlite"], indirect=True)
async def test_a_once_tool_that_returned_before_the_crash_keeps_its_result(
    service: Service,
) -> None:
    session_id, events = await crash_while(service, "note")
    (run,) = service.runs(session_id, "pay")  # once, and only once
    assert len(service.runs(session_id, "note")) == 2, "the ordinary tool did not run again"
    # Its result, logged by the run the kill ended, is what the model got: one tool_end.
    (end,) = tool_ends(events, "call_pay")
    assert not end.is_error
    assert not [e for e in events if kind(e) == "error"]
    output = json.loads(events[-1].completed.output_json)["result"]
    assert output["pay"] == {"tool": "pay", "key": run["key"]}
    assert len(tool_ends(events, "call_note")) == 1  # its first run was cut off
