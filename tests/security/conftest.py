"""Real credentials made in the test: a CA with a server and two client certificates,
a token file, JWT signing keys."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from helix_transport.testing.certs import TestCA
from tests.security.servers import serve_sqlite  # noqa: F401  (a fixture)

AUDIENCE = "helix-mesh-test"


@dataclass(frozen=True)
class Tokens:
    """Tokens of the token file: three principals in two tenants."""

    path: Path
    alice: str  # tenant acme
    bob: str  # tenant acme
    carol: str  # tenant globex


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    alice, bob, carol = (secrets.token_urlsafe(24) for _ in range(3))
    path = tmp_path / "tokens"
    path.write_text(
        "# token principal [tenant]\n"
        f"{alice} alice acme\n"
        f"{bob}   bob   acme   # same tenant as alice\n"
        "\n"
        f"{carol} carol globex\n"
    )
    return Tokens(path=path, alice=alice, bob=bob, carol=carol)


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate and two client certificates, as files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_a: tuple[Path, Path]  # (cert, key) of "agent-a.helix", tenant acme
    client_b: tuple[Path, Path]  # (cert, key) of "agent-b.helix", tenant globex
    stranger: tuple[Path, Path]  # a certificate from another CA


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA()
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    server_cert, server_key = ca.issue("helix-server", server=True).write(directory, "server")
    client_a = ca.issue("agent-a", organization="acme", sans=("agent-a.helix",))
    client_b = ca.issue("agent-b", organization="globex", sans=("agent-b.helix",))
    stranger = TestCA("another CA").issue("agent-a", organization="acme", sans=("agent-a.helix",))
    return Pki(
        ca=directory / "ca.crt",
        server_cert=server_cert,
        server_key=server_key,
        client_a=client_a.write(directory, "client-a"),
        client_b=client_b.write(directory, "client-b"),
        stranger=stranger.write(directory, "stranger"),
    )


@dataclass(frozen=True)
class JwtKeys:
    """An RS256 key pair (public key file for the server), an ES256 one, an HMAC secret."""

    rsa_private: Any
    rsa_public_file: Path
    ec_private: Any
    ec_public_file: Path
    hmac_secret: bytes
    hmac_file: Path
    other_rsa_private: Any  # not the configured key

    def token(self, key: Any = None, *, algorithm: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": "dave", "aud": AUDIENCE, "iat": now, "exp": now + 300, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.rsa_private if key is None else key, algorithm=algorithm)


def _public_pem(key: Any) -> bytes:
    return bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


@pytest.fixture(scope="session")
def jwt_keys(tmp_path_factory: pytest.TempPathFactory) -> JwtKeys:
    directory = tmp_path_factory.mktemp("jwt")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (directory / "rsa.pub").write_bytes(_public_pem(rsa_key))
    (directory / "ec.pub").write_bytes(_public_pem(ec_key))
    secret = secrets.token_bytes(48).hex().encode()
    (directory / "hmac.key").write_bytes(secret + b"\n")
    return JwtKeys(
        rsa_private=rsa_key,
        rsa_public_file=directory / "rsa.pub",
        ec_private=ec_key,
        ec_public_file=directory / "ec.pub",
        hmac_secret=secret,
        hmac_file=directory / "hmac.key",
        other_rsa_private=rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )
