"""Per-agent model configuration: model, retries, timeout and fallbacks, per type and by env.

Every run goes through a real server and litellm's real path: the models are scripted
providers (``helix_transport.agent.scripted``) that fail the way a provider does, at
call time (an error, or no first byte within the timeout), so what is proved is what
litellm does with ``num_retries``, ``timeout`` and ``fallbacks`` as the run loop passes
them, not a stand-in.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import litellm
import pytest
from pydantic import BaseModel

from helix_transport import Agent, AgentClient, UsageError, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.model_config import ModelConfig, type_env_suffix
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script
from helix_transport.config import Environment
from helix_transport.store import MemoryStore


class NoInput(BaseModel):
    pass


class Who(BaseModel):
    model: str


CALLS: Counter[str] = Counter()
"""Calls per script name, across this module's runs (scripts run in litellm's thread)."""


def answering(name: str) -> str:
    """A model that answers with its own name."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        CALLS[name] += 1
        return finish(model=name)

    return register_script(name, script)


def failing(name: str, *, times: int = 1_000_000) -> str:
    """A model whose first ``times`` calls fail as a provider's 503 would, then answers."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        CALLS[name] += 1
        if CALLS[name] <= times:
            raise litellm.exceptions.ServiceUnavailableError(
                message=f"{name}: 503 service unavailable", model=name, llm_provider="scripted"
            )
        return finish(model=name)

    return register_script(name, script)


def slow(name: str, latency_s: float) -> str:
    """A model that takes ``latency_s`` before its first byte."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        CALLS[name] += 1
        turn = finish(model=name)
        return ScriptedTurn(tool_calls=turn.tool_calls, latency_s=latency_s)

    return register_script(name, script)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def agent(name: str, model: str = "", **options: Any) -> Agent:
    return Agent(
        name=name,
        description="Answers with the model that answered.",
        input_model=NoInput,
        output_model=Who,
        model=model,
        **options,
    )


Run = Callable[[Agent], Any]


@pytest.fixture
async def run() -> AsyncIterator[Callable[[Agent], Any]]:
    """``await run(agent)``: one session on a real server; its final status."""
    servers: list[Any] = []

    async def _run(definition: Agent) -> pb.GetStatusResponse:
        server = await create_server(definition, MemoryStore(), allow_unauthenticated=True)
        await server.start()
        servers.append(server)
        async with await AgentClient.connect(server.address) as client:
            started = await client.start("{}")
            return await client.wait(started.session_id)

    yield _run
    for server in servers:
        await server.shutdown()


def answered_by(status: pb.GetStatusResponse) -> str:
    assert status.status == pb.SESSION_STATUS_COMPLETED, status.error
    return str(json.loads(status.output_json)["model"])


async def test_helix_model_type_overrides_helix_model_for_its_type_alone(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    special, general = answering(unique("special")), answering(unique("general"))
    alpha, beta = agent("cfg-alpha"), agent("cfg-beta", model=answering(unique("own")))
    monkeypatch.setenv("HELIX_MODEL", general)
    monkeypatch.setenv("HELIX_MODEL_CFG_ALPHA", special)

    assert answered_by(await run(alpha)) == special.split("/")[1]
    assert answered_by(await run(beta)) == general.split("/")[1]
    monkeypatch.delenv("HELIX_MODEL")
    assert answered_by(await run(beta)) == beta.resolved_model().split("/")[1]


async def test_a_fallback_answers_when_the_model_fails(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    down, backup, other = (
        failing(unique("down")),
        answering(unique("backup")),
        answering(unique("other")),
    )
    defined = agent("cfg-fallback", model=down, model_fallbacks=[backup])
    assert answered_by(await run(defined)) == backup.split("/")[1]
    assert CALLS[down.split("/")[1]] == 1  # no retries unless asked

    # By env, per type: replaces the definition's fallbacks.
    monkeypatch.setenv(
        "HELIX_LLM_FALLBACKS_CFG_FALLBACK", f"{failing(unique('also-down'))},{other}"
    )
    assert answered_by(await run(defined)) == other.split("/")[1]

    # Without a fallback the session fails, saying which model failed and why.
    status = await run(agent("cfg-nofallback", model=down))
    assert status.status == pb.SESSION_STATUS_FAILED
    assert down in status.error and "503 service unavailable" in status.error


async def test_retries_get_past_a_model_that_fails_twice(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = failing(unique("flaky"), times=2)
    assert answered_by(await run(agent("cfg-retries", model=flaky, model_num_retries=2)))
    assert CALLS[flaky.split("/")[1]] == 3  # two failures, then the answer

    flakier = failing(unique("flakier"), times=2)
    status = await run(agent("cfg-retries-env", model=flakier, model_num_retries=2))
    assert answered_by(status)
    monkeypatch.setenv("HELIX_LLM_NUM_RETRIES_CFG_RETRIES_ENV", "0")  # env wins: no retry
    flakiest = failing(unique("flakiest"), times=2)
    status = await run(agent("cfg-retries-env", model=flakiest, model_num_retries=2))
    assert status.status == pb.SESSION_STATUS_FAILED
    assert CALLS[flakiest.split("/")[1]] == 1


async def test_a_timeout_ends_a_slow_call_and_the_fallback_answers(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    sluggish, quick = slow(unique("sluggish"), latency_s=30), answering(unique("quick"))
    defined = agent("cfg-timeout", model=sluggish, model_fallbacks=[quick])
    monkeypatch.setenv("HELIX_LLM_TIMEOUT_S_CFG_TIMEOUT", "0.2")
    assert answered_by(await run(defined)) == quick.split("/")[1]

    # The process-wide variable, without a fallback: the session fails on the timeout.
    monkeypatch.delenv("HELIX_LLM_TIMEOUT_S_CFG_TIMEOUT")
    monkeypatch.setenv("HELIX_LLM_TIMEOUT_S", "0.2")
    status = await run(agent("cfg-timeout-alone", model=sluggish))
    assert status.status == pb.SESSION_STATUS_FAILED
    assert "no first byte within 0.2 s" in status.error

    # A latency within the timeout is only a wait.
    monkeypatch.setenv("HELIX_LLM_TIMEOUT_S", "10")
    patient = slow(unique("patient"), latency_s=0.1)
    assert answered_by(await run(agent("cfg-timeout-ok", model=patient)))


def test_settings_come_from_the_type_then_the_process_then_the_definition() -> None:
    defined = ModelConfig(model="m", num_retries=1, timeout_s=5, fallbacks=("f",))
    assert (
        defined.with_settings(Environment({}).model("researcher"), agent_type="researcher")
        == defined
    )
    assert defined.litellm_settings() == {"num_retries": 1, "timeout": 5, "fallbacks": ["f"]}
    assert ModelConfig(model="m").litellm_settings() == {}  # litellm's own defaults
    environ = {
        "HELIX_MODEL": "g",
        "HELIX_MODEL_TRANSLATOR_NODE": "t",
        "HELIX_LLM_NUM_RETRIES": "3",
        "HELIX_LLM_TIMEOUT_S_TRANSLATOR_NODE": "2.5",
        "HELIX_LLM_FALLBACKS": " a, b ,",
        "HELIX_LLM_FALLBACKS_TRANSLATOR_NODE": "",  # empty: unset
    }
    assert defined.with_settings(
        Environment(environ).model("translator-node"), agent_type="translator-node"
    ) == ModelConfig(model="t", num_retries=3, timeout_s=2.5, fallbacks=("a", "b"))
    assert Environment(environ).model("researcher").model == "g"
    assert type_env_suffix("translator-node") == "TRANSLATOR_NODE"


def test_bad_settings_are_usage_errors_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="HELIX_LLM_NUM_RETRIES_CFG='many' is not a number"):
        Environment({"HELIX_LLM_NUM_RETRIES_CFG": "many"}).model("cfg")
    with pytest.raises(UsageError, match="timeout_s must be a positive number"):
        env = Environment({"HELIX_LLM_TIMEOUT_S": "0"})
        ModelConfig(model="m").with_settings(env.model("cfg"), agent_type="cfg")
    with pytest.raises(UsageError, match="agent 'cfg': num_retries must be 0 or more"):
        agent("cfg", model="m", model_num_retries=-1)
    monkeypatch.delenv("HELIX_MODEL", raising=False)
    with pytest.raises(UsageError, match=r"set Agent\.model, HELIX_MODEL or HELIX_MODEL_CFG_X"):
        agent("cfg-x").model_config()


async def test_a_bad_variable_stops_the_server_or_fails_the_run_naming_it(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = agent("cfg-bad-env", model=answering(unique("never")))
    monkeypatch.setenv("HELIX_LLM_NUM_RETRIES_CFG_BAD_ENV", "many")
    with pytest.raises(UsageError, match="HELIX_LLM_NUM_RETRIES_CFG_BAD_ENV='many'"):
        await create_server(bad, MemoryStore(), allow_unauthenticated=True)
    # Set after the start (only a test does that): the run fails, saying why.
    monkeypatch.delenv("HELIX_LLM_NUM_RETRIES_CFG_BAD_ENV")
    server = await create_server(bad, MemoryStore(), allow_unauthenticated=True)
    async with server, await AgentClient.connect(server.address) as client:
        monkeypatch.setenv("HELIX_LLM_TIMEOUT_S_CFG_BAD_ENV", "soon")
        status = await client.wait((await client.start("{}")).session_id)
    assert status.status == pb.SESSION_STATUS_FAILED
    assert "HELIX_LLM_TIMEOUT_S_CFG_BAD_ENV='soon' is not a number" in status.error
