"""Cost of authentication per RPC, each mode beside no authentication in the same run.

    .venv/bin/python -m tests.bench.auth [--calls 2000] [--rounds 3]

One in-process server per mode (none, token file, JWT RS256, JWT HS256, TLS + token,
mutual TLS) serving the test counter agent; a client sends ``--calls`` sequential
``GetStatus`` calls on one finished session (a store read and the auth check, no
model). Modes are interleaved over ``--rounds`` to spread the machine's noise. Prints
p50 and p99 per call and the p50 ratio to no authentication.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from helix_transport import AgentClient, AuthConfig, ClientAuth, create_server
from helix_transport.store import MemoryStore
from helix_transport.testing.certs import TestCA
from tests.agents import counter

TOKEN = "bench-token-" + "x" * 32
AUDIENCE = "bench"


class _TlsFiles(TypedDict):
    tls_cert_file: str
    tls_key_file: str


def _modes(directory: Path) -> dict[str, tuple[AuthConfig, dict[str, Any], str]]:
    """mode -> (server auth, client auth kwargs, host to dial)."""
    tokens = directory / "tokens"
    tokens.write_text(f"{TOKEN} bench\n")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "rsa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    secret = b"s" * 48
    (directory / "hmac").write_bytes(secret)
    claims = {"sub": "bench", "aud": AUDIENCE, "exp": int(time.time()) + 3600}
    ca = TestCA()
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    cert, server_key = ca.issue("server", server=True).write(directory, "server")
    client = ca.issue("bench", sans=("bench.helix",))
    tls = _TlsFiles(tls_cert_file=str(cert), tls_key_file=str(server_key))
    return {
        "none": (AuthConfig(allow_unauthenticated=True), {}, "127.0.0.1"),
        "token file": (AuthConfig(tokens_file=str(tokens)), {"token": TOKEN}, "127.0.0.1"),
        "JWT RS256": (
            AuthConfig(jwt_key_file=str(directory / "rsa.pub"), jwt_audience=AUDIENCE),
            {"token": jwt.encode(claims, key, algorithm="RS256")},
            "127.0.0.1",
        ),
        "JWT HS256": (
            AuthConfig(jwt_key_file=str(directory / "hmac"), jwt_audience=AUDIENCE),
            {"token": jwt.encode(claims, secret, algorithm="HS256")},
            "127.0.0.1",
        ),
        "TLS + token": (
            AuthConfig(tokens_file=str(tokens), **tls),
            {"token": TOKEN, "tls_ca": ca.cert_pem},
            "localhost",
        ),
        "mutual TLS": (
            AuthConfig(tls_client_ca_file=str(directory / "ca.crt"), **tls),
            {"tls_ca": ca.cert_pem, "tls_cert": client.cert_pem, "tls_key": client.key_pem},
            "localhost",
        ),
    }


async def _measure(config: AuthConfig, auth: dict[str, Any], host: str, calls: int) -> list[float]:
    async with await create_server(counter, MemoryStore(), auth=config) as server:
        credentials = ClientAuth(**auth) if auth else None
        async with await AgentClient.connect(f"{host}:{server.port}", auth=credentials) as c:
            started = await c.start('{"steps": 1, "words": 1}')
            async for _ in c.stream(started.session_id):
                pass
            for _ in range(50):  # warm the channel and the handshake
                await c.get_status(started.session_id)
            timings = []
            for _ in range(calls):
                begin = time.perf_counter()
                await c.get_status(started.session_id)
                timings.append(time.perf_counter() - begin)
            return timings


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        modes = _modes(Path(tmp))
        timings: dict[str, list[float]] = {name: [] for name in modes}
        for _ in range(args.rounds):
            for name, (config, auth, host) in modes.items():
                timings[name] += await _measure(config, auth, host, args.calls // args.rounds)
    base = statistics.median(timings["none"])
    print(f"{'mode':<14} {'p50 ms':>8} {'p99 ms':>8} {'p50 / none':>11}")
    for name, values in timings.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(len(values) * 0.99) - 1]
        print(f"{name:<14} {p50 * 1e3:8.3f} {p99 * 1e3:8.3f} {p50 / base:10.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
