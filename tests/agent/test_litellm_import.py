"""litellm (2 s of CPU to import) loads on the first model call, not with an agent or a
server: a service answers its health check first (docs/performance.md, target 7)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helix_transport.server.app import MODEL_READY
from helix_transport.testing.processes import ServiceProcess, exec_process, free_port

_SERVE_THEN_CALL = textwrap.dedent(
    """
    import asyncio, json, sys
    from helix_transport import ServerConfig, create_server
    from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
    from helix_transport.store import MemoryStore
    from tests.agents import counter  # registers its scripts

    async def main():
        config = ServerConfig(port=0)
        async with await create_server(
            counter, MemoryStore(), config, allow_unauthenticated=True
        ) as server:
            print("serving, litellm imported:", "litellm" in sys.modules)
            request = pb.StartRequest(session_id="s", input_json=json.dumps({"steps": 1}))
            await server.servicer.Start(request, None)
            while (await server.store.get_session("s")).status.name == "RUNNING":
                await asyncio.sleep(0.05)
            record = await server.store.get_session("s")
            print("after a run:", record.status.name, "litellm" in sys.modules)

    asyncio.run(main())
    """
)


def test_a_server_starts_without_litellm_and_its_first_call_imports_it() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SERVE_THEN_CALL],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "serving, litellm imported: False" in lines
    # The scripts registered before litellm was imported reach it with the import.
    assert "after a run: COMPLETED True" in lines


async def test_serve_is_serving_before_its_model_is_ready(tmp_path: Path) -> None:
    proc = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'counter.db'}",
        log_path=tmp_path / "counter.log",
        spawner=exec_process,  # a new interpreter: what start-up means
    )
    await proc.start(timeout_s=120, ready="")  # as soon as it serves
    try:
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            first = await stub.Check(health_pb2.HealthCheckRequest(service=MODEL_READY))
            # Polled every 20 ms, SERVING is seen long before litellm's 2 s import ends.
            assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING
            await proc.wait_serving(timeout_s=120)  # MODEL_READY, the helper's default
            for service in ("", MODEL_READY):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await proc.stop()
