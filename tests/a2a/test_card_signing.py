"""The signed Agent Card: with a private key (``ServerConfig.a2a_card_key``, ``serve
--a2a-card-key``, ``HELIX_A2A_CARD_KEY``) the card at ``/.well-known/agent-card.json``
carries a JWS that a2a-sdk's own verifier accepts against the public key (in its
official client's card resolution, and on the card as served); a card changed in
transit, or checked against another key, is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as a2a
from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from google.protobuf import json_format

from helix_transport import ServerConfig, UsageError, create_server
from helix_transport.a2a.signing import load_card_key, thumbprint
from helix_transport.server.auth import AuthConfig
from helix_transport.store import open_store
from helix_transport.testing.processes import ServiceProcess, free_port
from tests.agents.a2a_tree import mailer_alone
from tests.helpers import ROOT

TOKEN = "card-token-0123456789abcdef"
CARD_PATH = "/.well-known/agent-card.json"

KEYS: dict[str, tuple[Callable[[], Any], str]] = {
    "ec-p256": (lambda: ec.generate_private_key(ec.SECP256R1()), "ES256"),
    "ec-p384": (lambda: ec.generate_private_key(ec.SECP384R1()), "ES384"),
    "rsa": (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
    "ed25519": (ed25519.Ed25519PrivateKey.generate, "EdDSA"),
}


def _pem(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _verifier(
    public: Any, algorithm: str, *, match_kid: bool = True
) -> Callable[[a2a.AgentCard], None]:
    """a2a-sdk's verifier, given the public key out of band, matched by the RFC 7638
    thumbprint as the key id (or, ``match_kid=False``, whatever the key id)."""
    expected_kid = thumbprint(_public_jwk(public))

    def key_provider(kid: str | None, jku: str | None) -> Any:
        assert jku is None and (kid == expected_kid or not match_kid)
        return public

    return create_signature_verifier(key_provider, [algorithm])


def _public_jwk(public: Any) -> dict[str, Any]:
    if isinstance(public, rsa.RSAPublicKey):
        return dict(jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True))
    if isinstance(public, ec.EllipticCurvePublicKey):
        return dict(jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True))
    return dict(jwt.algorithms.OKPAlgorithm.to_jwk(public, as_dict=True))


async def _card(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:  # the card is public
        response = await http.get(url + CARD_PATH)
    response.raise_for_status()
    card: dict[str, Any] = response.json()
    return card


def test_the_key_id_is_the_rfc_7638_thumbprint() -> None:
    # RFC 7638 section 3.1's example key and thumbprint.
    jwk = {
        "kty": "RSA",
        "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw",
        "e": "AQAB",
        "alg": "RS256",
        "kid": "2011-04-29",
    }
    assert thumbprint(jwk) == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


@pytest.mark.parametrize("kind", KEYS)
async def test_the_served_card_is_signed_and_the_sdk_verifies_it(tmp_path: Path, kind: str) -> None:
    make, algorithm = KEYS[kind]
    private = make()
    key_file = tmp_path / "card-key.pem"
    key_file.write_bytes(_pem(private))
    (tmp_path / "tokens").write_text(f"{TOKEN} alice\n")
    store = await open_store(f"sqlite:///{tmp_path / 'helix.db'}")
    server = await create_server(
        mailer_alone,
        store,
        ServerConfig(a2a_port=0, a2a_card_key=str(key_file)),
        auth=AuthConfig(tokens_file=str(tmp_path / "tokens")),
    )
    async with server:
        assert server.a2a is not None
        url = server.a2a.url
        verify = _verifier(private.public_key(), algorithm)
        # The official client resolves the card through the SDK's verifier, then calls.
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        client = await create_client(
            url, client_config=ClientConfig(httpx_client=http), signature_verifier=verify
        )
        listed = await client.list_tasks(a2a.ListTasksRequest())
        assert list(listed.tasks) == []
        await client.close()
        served = await _card(url)
        (signature,) = served["signatures"]
        header = jwt.get_unverified_header(f"{signature['protected']}.e30.")
        assert header == {"alg": algorithm, "kid": header["kid"], "typ": "JOSE"}
        verify(json_format.ParseDict(served, a2a.AgentCard()))
        # Any change to what was signed is refused: a field, a skill's schema, a URL.
        tampers: dict[str, tuple[list[str | int], Any]] = {
            "description": ([], "a different agent"),
            "input_schema": (
                ["capabilities", "extensions", 0, "params", "mailer"],
                {"type": "object"},
            ),
            "url": (["supportedInterfaces", 0], "http://attacker.example/"),
        }
        for field, (path, value) in tampers.items():
            changed = json.loads(json.dumps(served))
            target = changed
            for step in path:
                target = target[step]
            target[field] = value
            with pytest.raises(InvalidSignaturesError):
                verify(json_format.ParseDict(changed, a2a.AgentCard()))
        # Checked against another key (same algorithm), the card is refused too.
        other = _verifier(make().public_key(), algorithm, match_kid=False)
        with pytest.raises(InvalidSignaturesError):
            other(json_format.ParseDict(served, a2a.AgentCard()))
    await store.aclose()


async def test_without_a_key_the_card_is_unsigned(tmp_path: Path) -> None:
    store = await open_store("memory://")
    server = await create_server(
        mailer_alone, store, ServerConfig(a2a_port=0), allow_unauthenticated=True
    )
    async with server:
        assert server.a2a is not None
        assert "signatures" not in await _card(server.a2a.url)
    await store.aclose()


def test_a_key_that_cannot_sign_a_card_is_refused(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encrypted = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    secp256k1 = _pem(ec.generate_private_key(ec.SECP256K1()))
    for data, why in (
        (public, "not a PEM private key"),
        (b"an-hmac-secret-0123456789abcdef0123", "shared secret"),
        (encrypted, "cannot load"),
        (secp256k1, "no JWS algorithm"),
    ):
        with pytest.raises(UsageError, match=why):
            load_card_key(data)
    with pytest.raises(UsageError, match="needs an a2a_port"):
        ServerConfig(a2a_card_key=str(tmp_path / "key.pem"))


async def test_serve_signs_with_the_key_of_helix_a2a_card_key(tmp_path: Path) -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    key_file = tmp_path / "card-key.pem"
    key_file.write_bytes(_pem(private))
    a2a_port = free_port()
    process = ServiceProcess(
        "tests.agents.a2a_tree:mailer_alone",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'helix.db'}",
        log_path=tmp_path / "serve.log",
        env={"HELIX_A2A_CARD_KEY": str(key_file), "HELIX_LOG_LEVEL": "WARNING"},
        extra_args=["--a2a-port", str(a2a_port)],
        cwd=ROOT,
    )
    await process.start()
    try:
        served = await _card(f"http://127.0.0.1:{a2a_port}")
    finally:
        await process.stop()
    _verifier(private.public_key(), "EdDSA")(json_format.ParseDict(served, a2a.AgentCard()))
