"""A parent service killed mid-delegation and restarted, under authentication.

Tokens are never stored, so the resumed run has no caller token. ``substitute``
(the parent's own token) rejoins its child as without authentication; ``forward``
falls back to the parent's own token, which does not own the caller's child: the id
is free in the parent's own namespace, so its ``Start`` starts the child again there
(the caller's child runs on, its own). Without a credential it fails clearly.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from helix_transport import AgentClient, ClientAuth
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.helpers import ROOT
from tests.security.conftest import Tokens

STEPS = 4
INPUT = json.dumps({"calls": [{"tool": "count", "args": {"steps": STEPS, "words": 2}}]})


@pytest.mark.parametrize(
    ("identity", "outcome"),
    [
        ("substitute", {"total": STEPS, "steps": STEPS}),
        ("forward+own", {"total": STEPS, "steps": STEPS}),  # a second child, from the start
        ("forward", "no caller credential to forward"),
    ],
)
async def test_a_resumed_parent_and_its_child(
    tmp_path: Path, tokens: Tokens, identity: str, outcome: object
) -> None:
    own = tmp_path / "client-token"
    own.write_text(tokens.carol)
    identity_args = {
        "substitute": ["--client-token-file", str(own)],
        "forward+own": ["--client-identity", "forward", "--client-token-file", str(own)],
        "forward": ["--client-identity", "forward"],
    }[identity]

    def service(agent: str, *extra: str) -> ServiceProcess:
        return ServiceProcess(
            f"tests.agents:{agent}",
            port=free_port(),
            store_url=f"sqlite:///{tmp_path / (agent + '.db')}",
            log_path=tmp_path / f"{agent}.log",
            env={"HELIX_SCRIPTED_DELAY_MS": "15"},
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            auth_args=["--auth-tokens", str(tokens.path), *extra],
            cwd=ROOT,
        )

    child = service("counter")
    parent = service("delegator", *identity_args)
    parent.env[address_env_var("counter")] = child.address
    await asyncio.gather(child.start(timeout_s=90), parent.start(timeout_s=90))
    try:
        async with await AgentClient.connect(
            parent.address, auth=ClientAuth(token=tokens.alice)
        ) as alice:
            await alice.start(INPUT, session_id="root")
            events: list[pb.StreamEvent] = []
            async for event in alice.stream("root"):
                events.append(event)
                inner = event.child_event.event if event.HasField("child_event") else None
                if inner is not None and inner.HasField("step_started") and inner.step == 2:
                    break
            await parent.kill()  # SIGKILL mid-delegation: the caller's token is gone
            await parent.start(timeout_s=90)
            events += [e async for e in alice.stream("root", from_sequence=events[-1].sequence)]
    finally:
        await asyncio.gather(parent.stop(), child.stop())
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds.count("run_resumed") == 1 and kinds[-1] == "completed"
    (result,) = json.loads(events[-1].completed.output_json)["results"]
    if isinstance(outcome, dict):
        assert result == outcome  # rejoined, or (forward+own) run again under its own token
    else:
        assert isinstance(result, dict) and outcome in result["error"], result
