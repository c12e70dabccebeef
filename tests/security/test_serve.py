"""``helix-mesh serve`` as a real process: fails closed, authenticates with a token
file, and the CLI carries a token; the token never reaches the server's log."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from helix_transport.testing.processes import ServiceProcess, free_port
from tests.helpers import ROOT
from tests.security.conftest import Pki, Tokens


async def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", *args,
        cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_serve_refuses_to_start_without_authentication(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELIX_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "serve", "tests.agents:counter",
        "--port", str(free_port()), "--store", "memory://",
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert "refusing to start without authentication" in err.decode()
    assert "--allow-unauthenticated" in err.decode()
    assert "listening" not in out.decode()


async def test_serve_with_a_token_file_and_the_cli_with_a_token(
    tmp_path: Path, tokens: Tokens
) -> None:
    log = tmp_path / "serve.log"
    service = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url="memory://",
        log_path=log,
        cwd=ROOT,
        auth_args=["--auth-tokens", str(tokens.path)],
        env={"HELIX_LOG_LEVEL": "DEBUG"},
    )
    await service.start()
    try:
        code, out, err = await _cli("describe", service.address)
        assert code == 2 and "UNAUTHENTICATED" in err.upper() and "missing credentials" in err
        code, out, err = await _cli(
            "call", service.address, "--input", '{"steps": 1, "words": 1}',
            env={"HELIX_TOKEN": tokens.alice},
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out[out.rindex("{\n") :]) == {"total": 1, "steps": 1}
        token_file = tmp_path / "carol.token"
        token_file.write_text(tokens.carol + "\n")
        code, out, err = await _cli(
            "conformance", service.address, "--input", '{"steps": 1, "words": 1}',
            "--token-file", str(token_file),
        )  # fmt: skip
        assert code == 0, out + err
        code, out, err = await _cli("describe", service.address, "--token", "not-" + tokens.bob)
        assert code == 2 and "invalid bearer token" in err
        assert tokens.bob not in err
    finally:
        await service.terminate()
    text = log.read_text()
    assert "refused /helix.agent.v1.AgentService/Describe" in text  # refusals are logged...
    for token in (tokens.alice, tokens.bob, tokens.carol):
        assert token not in text  # ...never the credential


async def test_serve_with_mutual_tls_and_a_health_port(tmp_path: Path, pki: Pki) -> None:
    log = tmp_path / "serve.log"
    service = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url="memory://",
        log_path=log,
        cwd=ROOT,
        auth_args=[
            "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
            "--tls-client-ca", str(pki.ca), "--no-reflection",
        ],
        health_port=free_port(),  # ServiceProcess polls health there: plaintext, no cert
    )  # fmt: skip
    await service.start()
    try:
        cert, key = pki.client_a
        tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key)]
        code, out, err = await _cli(
            "call", f"localhost:{service.port}", "--input", '{"steps": 1, "words": 1}', *tls
        )
        assert code == 0, err
        assert json.loads(out[out.rindex("{\n") :]) == {"total": 1, "steps": 1}
        code, _, err = await _cli("describe", f"localhost:{service.port}", "--tls-ca", str(pki.ca))
        assert code == 4 and "cannot reach" in err  # no client certificate: no handshake
    finally:
        await service.terminate()
    assert "health on 127.0.0.1:" in log.read_text()
