"""Property-based fuzzing of every RPC of a live server with random and malformed requests.

Hypothesis drives random ``StartRequest``/``StreamRequest``/``GetStatusRequest``/
``InterruptRequest``/``DescribeRequest``/``ContinueRequest`` messages (near-valid and hostile inputs, odd
ids, NUL characters, huge and deeply nested JSON, absurd sequences) and raw random or
mutated bytes at a server on 127.0.0.1 (in-process grpc.aio over SQLite, anonymous;
and a real ``helix-mesh serve`` process with token authentication). The properties: the server stays up; no call ends in
UNKNOWN or INTERNAL; no status message leaks internals (a traceback, a Python class
name); and afterwards every session in the store has a consistent log and the
service still passes the conformance kit.

``HELIX_FUZZ_EXAMPLES`` sets the number of examples per property (default 60; try
2000 for a long run).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helix_transport import AgentServer, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import Store, open_store
from helix_transport.testing.conformance import run_conformance
from helix_transport.transport._auth import ClientAuth
from tests.agents.hostile import echo
from tests.helpers import ROOT, ServiceProcess, free_port
from tests.security.servers import BackgroundLoop, assert_store_consistent

EXAMPLES = int(os.environ.get("HELIX_FUZZ_EXAMPLES", "60"))
SERVICE = "/helix.agent.v1.AgentService/"
VALID_INPUT = '{"topic": "fuzz", "items": [{"name": "a"}]}'
KNOWN_IDS = ["known-1", "known-2", "known-1-remote-call_0"]

ALLOWED = {
    "Start": {"OK", "INVALID_ARGUMENT", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"},
    "Stream": {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"},
    "GetStatus": {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"},
    "Interrupt": {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"},
    "Describe": {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"},
    "Continue": {
        "OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION",
        "RESOURCE_EXHAUSTED",
    },
}  # fmt: skip
LEAKS = re.compile(r"Traceback|File \"|<class |Error parsing message|Exception|at 0x[0-9a-f]{6,}")

# --- strategies ---------------------------------------------------------------

session_ids = st.one_of(
    st.just(""),
    st.sampled_from(KNOWN_IDS),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,40}", fullmatch=True),
    st.text(max_size=40),  # any unicode, NUL and controls included
    st.text(alphabet="ab", min_size=500, max_size=600),  # around the length limit
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
near_valid_inputs = st.builds(
    lambda topic, items, tags: json.dumps({"topic": topic, "items": items, "tags": tags}),
    st.text(max_size=30),
    st.lists(
        st.fixed_dictionaries({"name": st.text(max_size=10)}, optional={"count": st.integers()}),
        max_size=3,
    ),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(), max_size=3),
)
input_jsons = st.one_of(
    near_valid_inputs,
    json_values.map(json.dumps),
    st.text(max_size=200),  # mostly not JSON at all
    st.integers(1, 400).map(lambda d: '{"topic": "t", "tags": ' + "[" * d + "]" * d + "}"),
    st.integers(1, 4).map(lambda n: json.dumps({"topic": "x" * (n * 350_000)})),  # 0.35-1.4 MB
    st.just(VALID_INPUT),
)
metadatas = st.one_of(
    st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=5),
    st.dictionaries(st.text(min_size=1, max_size=4), st.just("v"), min_size=60, max_size=70),
    st.dictionaries(st.text(max_size=3), st.text(min_size=4090, max_size=4100), max_size=1),
)
sequences = st.one_of(st.integers(-2, 60), st.integers(-(1 << 63), (1 << 63) - 1))
turns = st.one_of(st.integers(-2, 5), st.integers(-(1 << 31), (1 << 31) - 1))
reasons = st.one_of(st.text(max_size=30), st.text(alphabet="x\x00", min_size=4090, max_size=4100))

requests = st.one_of(
    st.builds(
        lambda *a: ("Start", pb.StartRequest(session_id=a[0], input_json=a[1], parent_session_id=a[2], metadata=a[3])),
        session_ids, input_jsons, session_ids, metadatas,
    ),
    st.builds(lambda s, f: ("Stream", pb.StreamRequest(session_id=s, from_sequence=f)), session_ids, sequences),
    st.builds(lambda s, c: ("GetStatus", pb.GetStatusRequest(session_id=s, include_children=c)), session_ids, st.booleans()),
    st.builds(lambda s, r: ("Interrupt", pb.InterruptRequest(session_id=s, reason=r)), session_ids, reasons),
    st.just(("Describe", pb.DescribeRequest())),
    st.builds(
        lambda s, m, t, f: ("Continue", pb.ContinueRequest(session_id=s, message=m, turn=t, fresh=f)),
        session_ids, st.one_of(st.text(max_size=40), input_jsons), turns, st.booleans(),
    ),
)  # fmt: skip


def _mutate(message: bytes, at: int, junk: bytes) -> bytes:
    at = at % (len(message) + 1)
    return message[:at] + junk + message[at + len(junk) :]


raw_requests = st.tuples(
    st.sampled_from(sorted(ALLOWED)),
    st.one_of(
        st.binary(max_size=300),
        st.builds(  # a valid message with a few bytes overwritten: wire-level near misses
            _mutate,
            st.sampled_from(
                [
                    pb.StartRequest(session_id="known-1", input_json=VALID_INPUT, metadata={"k": "v"}).SerializeToString(),
                    pb.StreamRequest(session_id="known-2", from_sequence=3).SerializeToString(),
                    pb.InterruptRequest(session_id="known-1", reason="r").SerializeToString(),
                    pb.ContinueRequest(session_id="known-2", message="more", turn=2).SerializeToString(),
                ]
            ),
            st.integers(0, 200),
            st.binary(min_size=1, max_size=4),
        ),
    ),
)  # fmt: skip


# --- calling and checking -------------------------------------------------------


@dataclass
class Outcome:
    code: str
    details: str


Metadata = tuple[tuple[str, str], ...]


def serialize(request: Message | bytes) -> bytes:
    """Raw bytes go out as they are: they are the fuzzed part."""
    return request if isinstance(request, bytes) else request.SerializeToString()


def invoke(
    channel: grpc.Channel, method: str, request: Message | bytes, metadata: Metadata = ()
) -> Outcome:
    """One call, sync; a stream is read to its end (or its 3 s deadline)."""
    try:
        if method == "Stream":
            stream: grpc.UnaryStreamMultiCallable[Message | bytes, bytes] = channel.unary_stream(
                SERVICE + method, request_serializer=serialize
            )
            for _ in stream(request, timeout=3, metadata=metadata):
                pass
        else:
            unary: grpc.UnaryUnaryMultiCallable[Message | bytes, bytes] = channel.unary_unary(
                SERVICE + method, request_serializer=serialize
            )
            unary(request, timeout=10, metadata=metadata)
    except grpc.RpcError as exc:
        return Outcome(exc.code().name, exc.details() or "")
    return Outcome("OK", "")


def check(
    channel: grpc.Channel, method: str, request: Message | bytes, metadata: Metadata = ()
) -> None:
    outcome = invoke(channel, method, request, metadata)
    shown = f"{method} {request!r}"[:300]
    assert outcome.code in ALLOWED[method], (shown, outcome)
    assert not LEAKS.search(outcome.details), (shown, outcome)
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING, shown


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(channel: grpc.Channel, *, examples: int = EXAMPLES, metadata: Metadata = ()) -> None:
    """Both properties, ``examples`` each, against ``channel``'s server (``metadata``
    carries the caller's credential when the server wants one)."""

    @settings(FUZZ_SETTINGS, max_examples=examples)
    @given(requests)
    def typed(case: tuple[str, Message]) -> None:
        check(channel, *case, metadata)

    @settings(FUZZ_SETTINGS, max_examples=examples)
    @given(raw_requests)
    def raw(case: tuple[str, bytes]) -> None:
        check(channel, *case, metadata)

    typed()
    raw()


async def seed(address: str, metadata: Metadata = ()) -> None:
    """Sessions the fuzzed ids can hit: finished ones, with logs to replay."""
    async with grpc.aio.insecure_channel(address) as channel:
        start = channel.unary_unary(
            SERVICE + "Start",
            request_serializer=pb.StartRequest.SerializeToString,
            response_deserializer=pb.StartResponse.FromString,
        )
        for session_id in KNOWN_IDS:
            request = pb.StartRequest(session_id=session_id, input_json=VALID_INPUT)
            await start(request, timeout=10, metadata=metadata)


async def conformance(address: str, auth: ClientAuth | None = None) -> None:
    await asyncio.sleep(2.5)  # let the caller's rate-limit bucket refill after the fuzz
    results = await run_conformance(address, input_json=VALID_INPUT, timeout_s=60, auth=auth)
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert not failed, failed


# --- the properties, on two servers -----------------------------------------------


@pytest.fixture(scope="module")
def background() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


def test_fuzz_in_process_server(
    background: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = tmp_path_factory.mktemp("fuzz") / "helix.db"

    async def up() -> tuple[Store, AgentServer]:
        store = await open_store(f"sqlite:///{db}")
        server = await create_server(echo, store, ServerConfig(), allow_unauthenticated=True)
        await server.start()
        await seed(server.address)
        return store, server

    store, server = background.run(up())
    try:
        with grpc.insecure_channel(server.address) as channel:
            fuzz(channel)
        checked = background.run(assert_store_consistent(store))
        background.run(conformance(server.address))
    finally:
        background.run(server.shutdown(0.5))
        background.run(store.aclose())
    assert checked >= len(KNOWN_IDS)


def test_fuzz_helix_mesh_serve_process(
    background: BackgroundLoop, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("fuzz-process")
    store_url = f"sqlite:///{work / 'helix.db'}"
    log = work / "server.log"
    # Authenticated: the limits charge a real principal, and garbage gets past auth to
    # the request checks (an unauthenticated call is refused before, see test_auth.py).
    token = secrets.token_urlsafe(24)
    (work / "tokens").write_text(f"{token} fuzzer acme\n")
    metadata = (("authorization", f"Bearer {token}"),)
    service = ServiceProcess(
        "tests.agents.hostile:echo",
        port=free_port(),
        store_url=store_url,
        log_path=log,
        cwd=ROOT,
        auth_args=["--auth-tokens", str(work / "tokens")],
    )
    background.run(service.start())
    try:
        background.run(seed(service.address, metadata))
        with grpc.insecure_channel(service.address) as channel:
            assert invoke(channel, "Describe", pb.DescribeRequest()).code == "UNAUTHENTICATED"
            fuzz(channel, examples=max(EXAMPLES // 2, 10), metadata=metadata)
        background.run(conformance(service.address, ClientAuth(token=token)))
        alive = service.proc is not None and service.proc.returncode is None
    finally:
        background.run(service.stop())

    async def consistent() -> int:
        store = await open_store(store_url)
        try:
            return await assert_store_consistent(store)
        finally:
            await store.aclose()

    assert alive, log.read_text()[-3000:]
    assert background.run(consistent()) >= len(KNOWN_IDS)
    text = Path(log).read_text()
    assert "unhandled error" not in text and "Traceback" not in text, text[-3000:]
