"""Identity across two ``helix-mesh serve`` processes: a parent service forwards its
caller's token to its child, or substitutes its own; no token ever shows up in a log,
an event, an error message or a trace span (an OTLP receiver collects the spans)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helix_transport import AgentClient, ClientAuth
from helix_transport._exceptions import SessionNotFound, Unauthenticated
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.helpers import ROOT
from tests.security.conftest import Tokens
from tests.tracing.otlp_receiver import OtlpReceiver

DELEGATE = json.dumps({"calls": [{"tool": "count", "args": {"steps": 2, "words": 2}}]})


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.mark.parametrize("identity", ["forward", "substitute"])
async def test_a_parent_process_presents_an_identity_to_its_child_process(
    tmp_path: Path, tokens: Tokens, receiver: OtlpReceiver, identity: str
) -> None:
    service_token = tmp_path / "client-token"
    service_token.write_text(tokens.carol + "\n")  # carol's token as the parent's own
    env = {
        "HELIX_LOG_LEVEL": "DEBUG",  # the chattiest the services get
        "LANGFUSE_PUBLIC_KEY": "pk-lf-test",
        "LANGFUSE_SECRET_KEY": "sk-lf-test",
        "LANGFUSE_HOST": receiver.url,
        "LANGFUSE_FLUSH_INTERVAL": "0.2",
    }
    auth_args = ["--auth-tokens", str(tokens.path)]

    def service(agent: str, *extra: str) -> ServiceProcess:
        return ServiceProcess(
            f"tests.agents:{agent}",
            port=free_port(),
            store_url=f"sqlite:///{tmp_path / (agent + '.db')}",
            log_path=tmp_path / f"{agent}.log",
            env=dict(env),
            cwd=ROOT,
            auth_args=[*auth_args, *extra],
        )

    child = service("counter")
    parent_identity = (
        ["--client-identity", "forward"]
        if identity == "forward"
        else ["--client-token-file", str(service_token)]
    )
    parent = service("delegator", *parent_identity)
    parent.env[address_env_var("counter")] = child.address
    await asyncio.gather(child.start(timeout_s=90), parent.start(timeout_s=90))
    try:
        async with await AgentClient.connect(
            parent.address, auth=ClientAuth(token=tokens.alice)
        ) as alice:
            started = await alice.start(DELEGATE, session_id="root-1")
            events = [e async for e in alice.stream(started.session_id)]
            assert events[-1].WhichOneof("payload") == "completed", events[-1]
            (child_id,) = {
                e.subagent_start.child_session_id for e in events if e.HasField("subagent_start")
            }
            rolled = await alice.get_status("root-1", include_children=True)
            assert rolled.total_usage.total_tokens > rolled.usage.total_tokens
        owner, stranger = (
            (tokens.alice, tokens.carol) if identity == "forward" else (tokens.carol, tokens.alice)
        )
        async with await AgentClient.connect(child.address, auth=ClientAuth(token=owner)) as c:
            status = await c.get_status(child_id)
            assert status.status == pb.SESSION_STATUS_COMPLETED
            child_events = [e async for e in c.stream(child_id)]
        async with await AgentClient.connect(child.address, auth=ClientAuth(token=stranger)) as c:
            with pytest.raises(SessionNotFound):
                await c.get_status(child_id)
        errors: list[str] = []
        async with await AgentClient.connect(
            child.address, auth=ClientAuth(token=tokens.bob + "x")
        ) as forger:
            with pytest.raises(Unauthenticated) as raised:
                await forger.describe()
            errors.append(str(raised.value))
    finally:
        codes = await asyncio.gather(parent.terminate(), child.terminate())  # flushes spans
    assert list(codes) == [0, 0]  # gather gives a list; its stub says a tuple

    secrets = {tokens.alice, tokens.bob, tokens.carol}
    logs = (tmp_path / "counter.log").read_text() + (tmp_path / "delegator.log").read_text()
    assert "DEBUG" in logs
    stored = [e.SerializeToString() for e in events + child_events]
    spans = receiver.snapshot()
    assert {s.service_name for s in spans} >= {"counter", "delegator"}
    span_text = repr([(s.name, s.attributes) for s in spans])
    for secret in secrets:
        assert secret not in logs
        assert not any(secret.encode() in raw for raw in stored)
        assert secret not in span_text
        assert not any(secret in e for e in errors)
