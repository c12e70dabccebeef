"""The mesh registry resolves agent types to addresses from the environment or a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helix_transport import AgentClient, UsageError, create_server
from helix_transport.registry import address_env_var, resolve_address
from helix_transport.store import MemoryStore
from tests.agents import counter


def test_env_var_name_upper_cases_and_replaces_dashes() -> None:
    assert address_env_var("web-researcher") == "HELIX_AGENT_ADDRESS_WEB_RESEARCHER"


def test_env_wins_over_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps({"researcher": "10.0.0.1:1", "summarizer": "dns:///s:50051"}))
    monkeypatch.setenv("HELIX_REGISTRY_FILE", str(registry))
    monkeypatch.setenv("HELIX_AGENT_ADDRESS_RESEARCHER", "127.0.0.1:50061")
    assert resolve_address("researcher") == "127.0.0.1:50061"
    assert resolve_address("summarizer") == "dns:///s:50051"


def test_missing_address_says_how_to_configure_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HELIX_REGISTRY_FILE", raising=False)
    monkeypatch.delenv("HELIX_AGENT_ADDRESS_NOBODY", raising=False)
    with pytest.raises(UsageError, match="HELIX_AGENT_ADDRESS_NOBODY"):
        resolve_address("nobody")


def test_unreadable_registry_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "registry.json"
    bad.write_text("{not json")
    monkeypatch.setenv("HELIX_REGISTRY_FILE", str(bad))
    with pytest.raises(UsageError, match="cannot read registry file"):
        resolve_address("researcher")


async def test_dns_target_reaches_the_service() -> None:
    server = await create_server(counter, MemoryStore(), allow_unauthenticated=True)
    async with server, await AgentClient.connect(f"dns:///127.0.0.1:{server.port}") as client:
        described = await client.describe()
    assert described.agent_type == "counter"


def test_service_config_balances_and_retries_unary_calls() -> None:
    import json as _json

    from helix_transport import ClientConfig

    options = dict(ClientConfig().channel_options())
    config = _json.loads(str(options["grpc.service_config"]))
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    (method_config,) = config["methodConfig"]
    assert {n["method"] for n in method_config["name"]} == {
        "Start",
        "GetStatus",
        "Interrupt",
        "Describe",
        "ListSessions",
        "SubmitInput",  # idempotent per request id
    }
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert options["grpc.enable_retries"] == 1


async def test_client_names_the_session_so_start_is_idempotent() -> None:
    server = await create_server(counter, MemoryStore(), allow_unauthenticated=True)
    async with server, await AgentClient.connect(server.address) as client:
        started = await client.start('{"steps": 1}')
        again = await client.start('{"steps": 1}', session_id=started.session_id)
    assert len(started.session_id) == 32 and started.created and not again.created
