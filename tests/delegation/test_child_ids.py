"""A child's session id is always one its service accepts.

Children are named after their parent (``{parent}-remote-{tool_call_id}-{scope}``,
``-agent-{name}-``, ``-task-{tool_call_id}-{i}-``). A parent id near the 512-character
limit, a tree a few levels deep or a provider's tool call id with ``/``, ``+`` or ``=``
made a name the child's ``Start`` refused (INVALID_ARGUMENT), and the parent finished
with the wrong output. ``derived_session_id`` keeps every name that was valid as it
was (a parent mid-delegation across an upgrade rejoins its child) and hashes the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from helix_transport import Agent, AgentClient, create_server
from helix_transport._events import SessionStatus
from helix_transport._metadata import DELEGATION_PATH_KEY
from helix_transport.agent.tools import (
    MAX_SESSION_ID,
    child_scope,
    derived_session_id,
)
from helix_transport.delegation.companions import child_session_id as companion_id
from helix_transport.delegation.remote import child_session_id as remote_id
from helix_transport.registry import address_env_var
from helix_transport.server import _validation as check
from helix_transport.store import MemoryStore
from tests.agents.trees import ODD_CALL_ID, companion_caller, echo, remote_caller, task_caller
from tests.helpers import ROOT

SCOPE = child_scope("researcher", "alice", "acme")
KINDS = ("remote", "agent", "task")


def assert_valid(session_id: str) -> None:
    """What the child's server checks (raises InvalidArgument otherwise)."""
    assert check.session_id(session_id) == session_id
    assert len(session_id) <= MAX_SESSION_ID


def test_an_id_that_was_valid_stays_exactly_as_it_was() -> None:
    assert (
        derived_session_id("root", "remote", "call_1_0", SCOPE) == f"root-remote-call_1_0-{SCOPE}"
    )
    assert remote_id("root", "call_1_0", SCOPE) == f"root-remote-call_1_0-{SCOPE}"
    assert companion_id("root", "critic-1", SCOPE) == f"root-agent-critic-1-{SCOPE}"
    # The longest parent whose plain child id still fits keeps it.
    parent = "p" * (MAX_SESSION_ID - len(f"-remote-call_1_0-{SCOPE}"))
    assert derived_session_id(parent, "remote", "call_1_0", SCOPE) == (
        f"{parent}-remote-call_1_0-{SCOPE}"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_root_length_up_to_the_limit_gives_valid_distinct_ids(kind: str) -> None:
    seen: set[str] = set()
    for length in range(470, MAX_SESSION_ID + 1):
        parent = ("r" * length)[:length]
        child = derived_session_id(parent, kind, "call_1_0-0", SCOPE)
        assert_valid(child)
        plain = f"{parent}-{kind}-call_1_0-0-{SCOPE}"
        assert child == plain if len(plain) <= MAX_SESSION_ID else child != plain
        seen.add(child)
    assert len(seen) == MAX_SESSION_ID + 1 - 470


def test_ten_levels_below_a_512_character_root_are_valid_and_distinct() -> None:
    for kind in KINDS:
        ids = ["x" * MAX_SESSION_ID]
        for _ in range(10):
            ids.append(derived_session_id(ids[-1], kind, "call_1_0", SCOPE))
        for child in ids[1:]:
            assert_valid(child)
            assert child.startswith("x" * 100)  # a readable prefix of the root
        assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("call_id", ["call/1", "call+1", "call=1", "a/b+c==", "c" * 600])
def test_tool_call_ids_outside_the_alphabet_or_too_long_give_valid_ids(call_id: str) -> None:
    for parent in ("root", "r" * MAX_SESSION_ID):
        child = derived_session_id(parent, "remote", call_id, SCOPE)
        assert_valid(child)
        assert child.startswith(parent[:100])


def test_distinct_inputs_give_distinct_ids() -> None:
    keys = ["a/b", "a+b", "a=b", "a_b", "a/b/", "c" * 600, "c" * 601]
    ids = {derived_session_id("root", "remote", key, SCOPE) for key in keys}
    assert len(ids) == len(keys)
    # Parents that differ only past the readable prefix, kinds, scopes.
    long_a, long_b = "r" * 600 + "a", "r" * 600 + "b"
    assert derived_session_id(long_a, "task", "k", SCOPE) != derived_session_id(
        long_b, "task", "k", SCOPE
    )
    assert derived_session_id(long_a, "task", "k", SCOPE) != derived_session_id(
        long_a, "agent", "k", SCOPE
    )
    other = child_scope("researcher", "bob", "acme")
    assert derived_session_id(long_a, "task", "k", SCOPE) != derived_session_id(
        long_a, "task", "k", other
    )
    # A hashed id ends in a 64-digit digest, a plain one in "-" and a 16-digit scope.
    hashed = derived_session_id("root", "remote", "a/b", SCOPE)
    assert hashed[-17] != "-" and all(c in "0123456789abcdef" for c in hashed[-64:])


@pytest.mark.parametrize(
    "parent",
    ["", "-starts-badly", "4f2a9c/root", "tenant/" + "r" * 600, "récit", "bad\ud800surrogate"],
)
def test_any_parent_string_gives_a_valid_id(parent: str) -> None:
    for kind in KINDS:
        assert_valid(derived_session_id(parent, kind, "call/1", SCOPE))
    # The namespaced form of a stored id ("<digest>/<id>") keeps its readable start.
    assert derived_session_id("4f2a9c/root", "remote", "c", SCOPE).startswith("4f2a9c-remote-")


def test_the_same_inputs_give_the_same_id_in_another_process() -> None:
    cases = [("r" * MAX_SESSION_ID, "remote", ODD_CALL_ID), ("root", "task", "c" * 600 + "-0")]
    here = [derived_session_id(p, k, key, SCOPE) for p, k, key in cases]
    assert here == [derived_session_id(p, k, key, SCOPE) for p, k, key in cases]
    code = (
        "import json, sys\n"
        "from helix_transport.agent.tools import derived_session_id\n"
        "cases, scope = json.loads(sys.stdin.read())\n"
        "print(json.dumps([derived_session_id(p, k, key, scope) for p, k, key in cases]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    there = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([cases, SCOPE]),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=ROOT,
    )
    assert json.loads(there.stdout) == here


# --- over real services -----------------------------------------------------------------

LONG_ROOT = "root-" + "r" * (MAX_SESSION_ID - len("root-"))


@asynccontextmanager
async def parent_and_echo(
    parent: Agent, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AgentClient, MemoryStore]]:
    """An echo service and ``parent``'s, on 127.0.0.1: a client of the parent, the echo
    service's store."""
    echo_store = MemoryStore()
    async with await create_server(echo, echo_store, allow_unauthenticated=True) as child:
        monkeypatch.setenv(address_env_var("echo"), child.address)
        async with (
            await create_server(parent, MemoryStore(), allow_unauthenticated=True) as server,
            await AgentClient.connect(server.address) as client,
        ):
            yield client, echo_store


async def run_to_end(client: AgentClient, session_id: str) -> dict[str, object]:
    await client.start(json.dumps({"text": "hi"}), session_id=session_id)
    events = [e async for e in client.stream(session_id)]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    output: dict[str, object] = json.loads(events[-1].completed.output_json)
    return output


async def only_child(store: MemoryStore, parent_type: str) -> str:
    """The one child the echo service ran; its ``Start`` carried the parent's type."""
    sessions = await store.list_sessions(status=SessionStatus.COMPLETED)
    assert len(sessions) == 1
    assert_valid(sessions[0].session_id)
    assert json.loads(sessions[0].metadata[DELEGATION_PATH_KEY]) == [parent_type]
    return sessions[0].session_id


async def test_a_remote_child_of_a_512_character_root_with_an_odd_call_id_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with parent_and_echo(remote_caller, monkeypatch) as (client, echo_store):
        output = await run_to_end(client, LONG_ROOT)
        child = await only_child(echo_store, "remote-caller")
    assert output == {"answer": [{"echo": "hi"}]}
    assert child == remote_id(LONG_ROOT, ODD_CALL_ID, child_scope("remote-caller", ""))


async def test_a_companion_child_of_a_512_character_root_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with parent_and_echo(companion_caller, monkeypatch) as (client, echo_store):
        output = await run_to_end(client, LONG_ROOT)
        child = await only_child(echo_store, "companion-caller")
    assert isinstance(output["answer"], list) and len(output["answer"]) == 1
    result: dict[str, object] = output["answer"][0]
    assert result["output"] == {"echo": "hi"}, result
    assert child == companion_id(LONG_ROOT, "helper", child_scope("companion-caller", ""))


async def test_a_run_subagent_task_of_a_512_character_root_with_an_odd_call_id_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with parent_and_echo(task_caller, monkeypatch) as (client, echo_store):
        output = await run_to_end(client, LONG_ROOT)
        child = await only_child(echo_store, "task-caller")
    delivered = str(output["answer"])
    assert '"completed"' in delivered and '{"echo": "hi"}' in delivered, delivered
    scope = child_scope("task-caller", "")
    assert child == derived_session_id(LONG_ROOT, "task", f"{ODD_CALL_ID}-0", scope)
