"""``helix.admin.v1.AdminService`` and ``helix-mesh gc ADDRESS``: only a named admin of no
tenant may sweep a service's store, and a sweep through it removes what ``gc STORE_URL``
would."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from helix_transport import AgentClient, ClientAuth, ServerConfig, SessionExpired, create_server
from helix_transport._proto.helix.admin.v1 import admin_pb2 as pb
from helix_transport._proto.helix.admin.v1 import admin_pb2_grpc as pb_grpc
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore, SqliteStore
from tests.agents import counter
from tests.cli.test_cli import cli

OPS, ALICE, TENANT_OPS = "o" * 24, "a" * 24, "t" * 24
"""Tokens: ``ops`` (no tenant, the admin), ``alice`` of tenant acme, and an ``ops`` of
tenant acme (same name, not the admin)."""


def _sweep_request(retention_s: float | None, *, dry_run: bool = False) -> pb.SweepRequest:
    request = pb.SweepRequest(dry_run=dry_run)
    if retention_s is not None:
        request.retention.FromTimedelta(timedelta(seconds=retention_s))
    return request


async def _status(
    address: str, token: str, request: pb.SweepRequest
) -> tuple[grpc.StatusCode, str]:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await pb_grpc.AdminServiceStub(channel).Sweep(request, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


async def test_only_an_admin_of_no_tenant_sweeps(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{OPS} ops\n{ALICE} alice acme\n{TENANT_OPS} ops acme\n")
    store = await SqliteStore.open(str(tmp_path / "helix.db"))
    config = ServerConfig(admins=("ops",))
    auth = AuthConfig(tokens_file=str(tokens))
    async with await create_server(counter, store, config, auth=auth) as server:
        address = server.address
        async with await AgentClient.connect(address, auth=ClientAuth(token=ALICE)) as alice:
            await alice.start(json.dumps({"steps": 1}), session_id="mine")
            finished = await alice.wait("mine")
            # Sessions finished more than 5 s ago: wait for them to pass. The sweep keeps
            # a tombstone as long as the retention: 1 s was shorter than a loaded host
            # took from the sweep to the status read below (NOT_FOUND, not expired).
            # ToSeconds() would drop the fraction: up to a second too early.
            ended = finished.finished_at.ToNanoseconds() / 1e9
            await asyncio.sleep(max(0.0, ended + 5.5 - time.time()))

            for token in (ALICE, TENANT_OPS):
                code, details = await _status(address, token, _sweep_request(1))
                assert code is grpc.StatusCode.PERMISSION_DENIED
                assert "is not an admin of this service" in details
            code, _ = await _status(address, "", _sweep_request(1))
            assert code is grpc.StatusCode.UNAUTHENTICATED
            code, details = await _status(address, OPS, _sweep_request(None))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "retention" in details
            code, details = await _status(address, OPS, _sweep_request(-5))
            assert code is grpc.StatusCode.INVALID_ARGUMENT and "retention" in details

            rc, out, err = await cli(
                "gc", address, "--retention", "5s", "--dry-run", "--token", OPS
            )
            assert rc == 0, err
            (line, summary) = out.splitlines()
            assert line.startswith("would remove ") and line.endswith("/mine")  # alice's key
            assert summary == "would remove 1 session(s) finished more than 0:00:05 ago"
            rc, out, _ = await cli("gc", address, "--retention", "5s", "--token", ALICE)
            assert rc == 2 and out == ""  # refused: a usage error (docs/cli.md)
            rc, out, err = await cli("gc", address, "--retention", "5s", "--token", OPS)
            assert rc == 0, err
            assert out.splitlines()[-1] == "removed 1 session(s) finished more than 0:00:05 ago"
            with pytest.raises(SessionExpired):
                await alice.get_status("mine")
    await store.aclose()


async def test_a_service_without_authentication_has_no_admin() -> None:
    config = ServerConfig(admins=("anonymous",))
    async with await create_server(
        counter, MemoryStore(), config, allow_unauthenticated=True
    ) as server:
        code, details = await _status(server.address, "", _sweep_request(60))
        assert code is grpc.StatusCode.PERMISSION_DENIED and "'anonymous'" in details
        rc, _, err = await cli("gc", server.address, "--retention", "1h")
        assert rc == 2 and "PERMISSION_DENIED" in err
