"""What a plain service loads: nothing an unused feature needs (docs/performance.md,
target 7: each package a service imports stays in its memory for good).

A fresh interpreter serves ``counter`` the way ``helix-mesh serve`` does (its modules,
a token file, SQLite), then names the heavy modules it holds. Each feature below loads
its package only when configured; the second half configures one and sees it load, so
the names checked are the ones that would appear.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

_LAZY = (
    "jwt",  # JWT authentication (--jwt-key)
    "cryptography.x509",  # TLS and mutual TLS (--tls-cert, --tls-client-ca), PEM JWT keys
    "litellm",  # loaded after SERVING, in a thread (test_litellm_import.py)
    "a2a",  # --a2a-port
    "starlette",  # --a2a-port, helix-mesh inspect
    "uvicorn",
    "opentelemetry.sdk",  # tracing (LANGFUSE_*, OTEL_EXPORTER_OTLP_*), --metrics-port
    "prometheus_client",
    "redis",  # --store redis://
    "asyncpg",  # --store postgresql://
)

_SERVE = """
import asyncio, json, sys
import helix_transport.cli.main, helix_transport.cli.serve
from helix_transport.server.app import create_server, load_agent
from helix_transport.server.auth import AuthConfig
from helix_transport.store import open_store

async def main(auth):
    agent = load_agent("tests.agents:counter")
    store = await open_store(sys.argv[2])
    try:
        async with await create_server(agent, store, auth=AuthConfig(**auth)):
            print(json.dumps([m for m in json.loads(sys.argv[3]) if m in sys.modules]))
    finally:
        await store.aclose()

asyncio.run(main(json.loads(sys.argv[1])))
"""


def _loaded_while_serving(tmp_path: Path, **auth: str) -> list[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _SERVE,
            json.dumps(auth),
            f"sqlite:///{tmp_path / 'counter.db'}",
            json.dumps(_LAZY),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.splitlines()[-1])
    return loaded


def test_a_service_with_a_token_file_loads_no_unused_feature(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-long-enough-to-pass alice\n")
    assert _loaded_while_serving(tmp_path, tokens_file=str(tokens)) == []


def test_jwt_authentication_loads_pyjwt_when_configured(tmp_path: Path) -> None:
    key = tmp_path / "hmac.key"
    key.write_bytes(b"k" * 32)
    loaded = _loaded_while_serving(tmp_path, jwt_key_file=str(key), jwt_audience="helix")
    assert "jwt" in loaded  # (with the parts of cryptography PyJWT imports)
