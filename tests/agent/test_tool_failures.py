"""A tool or provider failing badly ends as a clear error the model (or the caller) sees,
and never as a session stuck running, an event no stream can send, or a stopped server."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport import Agent, tool
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.loop import MAX_ERROR_BYTES
from helix_transport.agent.scripted import ScriptedTurn, call, finish, register_script, steps_taken
from helix_transport.agent.tools import ToolContext
from tests.conftest import Serve

pytestmark = pytest.mark.parametrize("store", ["memory"], indirect=True)


class _Args(BaseModel):
    size: int = 0


class _Done(BaseModel):
    ok: bool


class LibraryAbort(BaseException):
    """As some libraries raise (gevent's Timeout, trio's Cancelled): not an Exception."""


@tool
async def aborts(ctx: ToolContext, args: _Args) -> str:
    raise LibraryAbort("gave up")


@tool
async def exits(ctx: ToolContext, args: _Args) -> str:
    sys.exit(3)


@tool
async def fetch(ctx: ToolContext, args: _Args) -> str:
    # An HTTP client that puts the whole response body in its exception.
    raise ValueError("upstream said: " + "x" * args.size)


@tool
async def measure(ctx: ToolContext, args: _Args) -> dict[str, float]:
    return {"mean": float("nan"), "max": float("inf")}  # 0/0 in numpy gives NaN


def _agent(name: str, tool_name: str, size: int = 0) -> Agent:
    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            return ScriptedTurn(tool_calls=(call(tool_name, size=size),))
        return finish(ok=True)

    return Agent(
        name=name,
        description=f"calls {tool_name}",
        input_model=_Args,
        output_model=_Done,
        tools=[aborts, exits, fetch, measure],
        model=register_script(name, script),
    )


async def _tool_end(serve: Serve, agent: Agent) -> pb.ToolEnd:
    async with serve(agent) as (_, client):
        await client.start("{}", session_id="t1")
        async with asyncio.timeout(20):
            events = [e async for e in client.stream("t1")]
        # The service is still up to answer (sys.exit in a tool stopped it).
        status = await client.get_status("t1")
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    assert status.status == pb.SESSION_STATUS_COMPLETED
    end = next(e.tool_end for e in events if e.WhichOneof("payload") == "tool_end")
    assert end.is_error
    return end


async def test_a_base_exception_from_a_tool_is_its_failure(serve: Serve) -> None:
    # It escaped the run: the session stayed RUNNING, and each orphan scan ran the tool
    # again into the same crash.
    end = await _tool_end(serve, _agent("aborter", "aborts"))
    assert json.loads(end.result_json) == {"error": "LibraryAbort: gave up"}


async def test_sys_exit_in_a_tool_fails_the_call_not_the_server(serve: Serve) -> None:
    end = await _tool_end(serve, _agent("exiter", "exits"))
    assert json.loads(end.result_json) == {"error": "SystemExit: 3"}


async def test_a_huge_tool_error_is_cut_to_fit_an_event(serve: Serve) -> None:
    # 5 MiB of error text made a tool_end over the 4 MiB message limit: the run went
    # on, but no Stream of the session could get past that event.
    end = await _tool_end(serve, _agent("fetcher", "fetch", size=5 << 20))
    error = json.loads(end.result_json)["error"]
    assert error.startswith("ValueError: upstream said: xxx")
    assert len(error.encode()) < MAX_ERROR_BYTES + 100
    assert error.endswith(
        f"({len('ValueError: upstream said: ') + (5 << 20) - MAX_ERROR_BYTES} bytes cut)"
    )


async def test_a_tool_result_that_is_not_json_is_an_error(serve: Serve) -> None:
    # NaN and Infinity went into result_json as is: no parser but Python's reads them.
    end = await _tool_end(serve, _agent("measurer", "measure"))
    error = json.loads(end.result_json)["error"]  # strict JSON now
    assert "not JSON" in error and "Out of range float values" in error


def _provider_fails_at_length(messages: list[dict[str, Any]]) -> ScriptedTurn:
    raise RuntimeError("provider said: " + "y" * (100 << 10))


def _provider_aborts(messages: list[dict[str, Any]]) -> ScriptedTurn:
    raise LibraryAbort("the provider's library gave up")


async def _failed_run(
    serve: Serve, name: str, script: Callable[[list[dict[str, Any]]], ScriptedTurn]
) -> tuple[pb.StreamEvent, pb.GetStatusResponse]:
    """Run an agent whose model call raises; its last event and its status."""
    agent = Agent(
        name=name,
        description="a model call that raises",
        input_model=_Args,
        output_model=_Done,
        model=register_script(name, script),
    )
    async with serve(agent) as (_, client):
        await client.start("{}", session_id="f1")
        async with asyncio.timeout(20):
            events = [e async for e in client.stream("f1")]
        status = await client.get_status("f1")
    assert events[-1].WhichOneof("payload") == "failed"
    assert events[-1].failed.error == status.error
    return events[-1], status


async def test_a_huge_provider_error_fails_the_run_in_an_event_that_streams(serve: Serve) -> None:
    _, status = await _failed_run(serve, "verbose-provider", _provider_fails_at_length)
    assert "provider said: yyy" in status.error
    assert len(status.error.encode()) < MAX_ERROR_BYTES + 100


async def test_a_base_exception_outside_any_tool_fails_the_run(serve: Serve) -> None:
    # Not a tool's: the run cannot go on, but it must end (failed, internal), not stay
    # RUNNING with no owner for each orphan scan to resume into the same crash.
    _, status = await _failed_run(serve, "aborting-provider", _provider_aborts)
    assert status.status == pb.SESSION_STATUS_FAILED and status.failure_reason == "internal"
