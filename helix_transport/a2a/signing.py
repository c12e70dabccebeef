"""The Agent Card's signature (A2A v1.0 ``signatures``): a JWS over the card's RFC 8785
canonical form, made by a2a-sdk's own signer (``a2a.utils.signing``) so any A2A
verifier, the SDK's first, checks exactly the bytes that were signed.

The key is a PEM private key (``--a2a-card-key``, ``HELIX_A2A_CARD_KEY``): RSA, EC
(P-256/384/521) or Ed25519/Ed448. The algorithm follows from the key, as the JWT
verifier's does (``server/_authenticators.load_jwt_key``), and the key id is the
public key's RFC 7638 thumbprint: stable across restarts and replicas, and computable
by a verifier from the public key it was given, with nothing to configure. An HMAC
secret is refused: whoever can verify with it can sign with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from a2a.types import a2a_pb2 as a2a
from a2a.utils.signing import ProtectedHeader, create_agent_card_signer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from helix_transport._exceptions import UsageError

_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
_THUMBPRINT_MEMBERS = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y")}
"""RFC 7638 section 3.2: the required members of each key type (``OKP``: RFC 8037)."""

PrivateKey = (
    rsa.RSAPrivateKey
    | ec.EllipticCurvePrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)


@dataclass(frozen=True, kw_only=True)
class CardKey:
    """A private key that signs the Agent Card, with its algorithm and key id."""

    key: PrivateKey
    algorithm: str
    """The JWS ``alg``: ``RS256``, ``ES256``/``ES384``/``ES512`` or ``EdDSA``."""
    key_id: str
    """The JWS ``kid``: the public key's RFC 7638 thumbprint (SHA-256, base64url)."""


def read_card_key(path: str) -> CardKey:
    """The signing key in the file ``path`` (read once, at start: a new key takes a
    restart, as the card itself is built once).

    Raises:
        UsageError: the file cannot be read, or ``load_card_key`` refuses it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"--a2a-card-key {path}: {exc.strerror or exc}") from None
    return load_card_key(data, source=path)


def load_card_key(data: bytes, *, source: str = "the A2A card key") -> CardKey:
    """The signing key in ``data`` (an unencrypted PEM private key).

    Raises:
        UsageError: not a PEM private key, encrypted, or of a type that cannot sign a card.
    """
    if b"PRIVATE KEY-----" not in data:
        raise UsageError(
            f"{source}: not a PEM private key (an asymmetric key signs the card: RSA, EC, "
            "Ed25519; a shared secret would let every verifier sign too)"
        )
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: encrypted without a password
        raise UsageError(f"{source}: cannot load the private key ({exc})") from None
    key: PrivateKey
    if isinstance(loaded, rsa.RSAPrivateKey):
        key, algorithm = loaded, "RS256"
    elif isinstance(loaded, ec.EllipticCurvePrivateKey):
        if loaded.curve.name not in _EC_ALGORITHMS:
            raise UsageError(f"{source}: EC curve {loaded.curve.name} has no JWS algorithm")
        key, algorithm = loaded, _EC_ALGORITHMS[loaded.curve.name]
    elif isinstance(loaded, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        key, algorithm = loaded, "EdDSA"
    else:
        raise UsageError(f"{source}: unsupported key type {type(loaded).__name__}")
    return CardKey(key=key, algorithm=algorithm, key_id=thumbprint(_jwk(key)))


def sign_card(card: a2a.AgentCard, key: CardKey) -> a2a.AgentCard:
    """``card`` with one more signature by ``key`` (in place, and returned).

    Sign the card last: any field changed afterwards invalidates the signature.
    """
    # No ``jku`` (the TypedDict wants one): the verifier is given the public key, and
    # a null member would be signed into every header.
    header = cast(ProtectedHeader, {"alg": key.algorithm, "kid": key.key_id, "typ": "JOSE"})
    pem = key.key.private_bytes(  # the SDK's signer is typed for PEM (or JWK), not key objects
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return create_agent_card_signer(pem, header)(card)


def thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638: SHA-256 over the required members, sorted, without whitespace."""
    members = _THUMBPRINT_MEMBERS.get(jwk["kty"], ("crv", "kty", "x"))
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _jwk(key: PrivateKey) -> dict[str, Any]:
    public = key.public_key()
    jwk: Any
    if isinstance(public, rsa.RSAPublicKey):
        jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
    elif isinstance(public, ec.EllipticCurvePublicKey):
        jwk = ECAlgorithm.to_jwk(public, as_dict=True)
    else:
        jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
    return dict(jwk)
