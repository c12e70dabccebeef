"""The authenticators a service checks callers with: a token file, JWTs, mutual TLS.

``AuthConfig.load_authenticators`` (``helix_transport.server.auth``) builds them from
the configured files; ``ChainAuthenticator`` asks each in turn for one call.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import grpc

# PyJWT and cryptography (~1 MiB of objects) are imported where a JWT key, a token or a
# client certificate is read: a service without JWT or mutual TLS never loads them.
from helix_transport._exceptions import Unauthenticated, UsageError
from helix_transport.server._identity import ANONYMOUS, Principal

MIN_TOKEN_LENGTH = 16
"""Shorter tokens in a token file are refused: they could be guessed."""

MIN_HMAC_KEY_BYTES = 32
"""An HS256 key shorter than this is refused (RFC 7518 asks for at least 256 bits)."""


@dataclass(frozen=True, kw_only=True)
class Presented:
    """What one call presented to prove who it is."""

    bearer: str | None = field(default=None, repr=False)
    """The token of ``authorization: Bearer TOKEN``, when sent."""
    peer_identities: tuple[str, ...] = ()
    """A verified client certificate's identities (subjectAltNames, else the CN)."""
    peer_organization: str = ""
    """The verified client certificate's subject O."""


@runtime_checkable
class Authenticator(Protocol):
    """Turns what a call presented into a ``Principal``."""

    def authenticate(self, presented: Presented) -> Principal | None:
        """The caller; ``None`` when no credential of this kind was presented.

        Raises:
            Unauthenticated: a credential of this kind was presented and is not valid.
        """
        ...


@dataclass(frozen=True)
class _TokenEntry:
    digest: bytes
    principal: Principal


_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]+")
_ASCII_SPACE = re.compile(r"[ \t\r\f\v]+")


class TokenFileAuthenticator:
    """Opaque bearer tokens listed in a file: ``TOKEN PRINCIPAL [TENANT]`` per line.

    Tokens are kept only as SHA-256 digests and compared in constant time against
    every entry, so neither timing nor memory dumps reveal them.
    """

    def __init__(self, entries: Sequence[tuple[str, Principal]]) -> None:
        self._entries = [
            _TokenEntry(hashlib.sha256(token.encode()).digest(), principal)
            for token, principal in entries
        ]

    @classmethod
    def from_file(cls, path: str) -> TokenFileAuthenticator:
        """Parse a token file; errors name the line, never the token."""
        try:
            text = read_file(path, "--auth-tokens").decode("utf-8-sig")  # a BOM is no token's
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not UTF-8 text") from None
        entries: list[tuple[str, Principal]] = []
        seen: set[str] = set()
        for number, line in enumerate(text.splitlines(), start=1):
            # A comment is a line or a word that starts with '#': a '#' inside a token
            # is part of it (cutting there would accept a shorter, weaker token).
            # ASCII spaces only: an NBSP is part of a token (and refuses it below).
            parts = [part for part in _ASCII_SPACE.split(line) if part]
            if "#" in line:
                parts = list(itertools.takewhile(lambda part: not part.startswith("#"), parts))
            if not parts:
                continue
            if len(parts) not in (2, 3):
                raise UsageError(f"{path}:{number}: expected 'TOKEN PRINCIPAL [TENANT]'")
            token, name, tenant = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
            if not _PRINTABLE_ASCII.fullmatch(token):
                # gRPC metadata is ASCII: such a token could never be presented.
                raise UsageError(f"{path}:{number}: a token is printable ASCII only")
            if name == ANONYMOUS.name and not tenant:
                raise UsageError(
                    f"{path}:{number}: 'anonymous' is reserved (the caller of a service "
                    "without authentication, and the owner of its sessions)"
                )
            if len(token) < MIN_TOKEN_LENGTH:
                raise UsageError(
                    f"{path}:{number}: token too short (at least {MIN_TOKEN_LENGTH} characters)"
                )
            if token in seen:
                raise UsageError(f"{path}:{number}: the same token appears twice")
            seen.add(token)
            entries.append((token, Principal(name=name, tenant=tenant)))
        if not entries:
            raise UsageError(f"{path}: no tokens")
        return cls(entries)

    def authenticate(self, presented: Presented) -> Principal | None:
        if presented.bearer is None:
            return None
        digest = hashlib.sha256(presented.bearer.encode()).digest()
        found: Principal | None = None
        for entry in self._entries:  # no early exit: the time does not depend on the match
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found


class JwtAuthenticator:
    """JSON Web Tokens signed with one configured key.

    Required claims: ``sub`` (the principal), ``aud`` (must include the configured
    audience), ``exp``; ``iss`` when an issuer is configured. The tenant is the
    ``tenant_claim`` claim, empty when absent. The algorithms follow from the key
    type, so a token can never choose ``none`` or switch an RSA key to HMAC.
    """

    LEEWAY_S = 10.0
    """Clock skew tolerated on ``exp``/``nbf``/``iat``."""

    def __init__(
        self,
        key: Any,
        *,
        algorithms: Sequence[str],
        audience: str,
        issuer: str = "",
        tenant_claim: str = "tenant",
    ) -> None:
        if not audience:
            raise UsageError("a JWT audience is required")
        import jwt  # noqa: F401  # loaded now, at start-up, not inside the first call

        self._key = key
        self._algorithms = list(algorithms)
        self._audience = audience
        self._issuer = issuer
        self._tenant_claim = tenant_claim

    @classmethod
    def from_key_file(
        cls, path: str, *, audience: str, issuer: str = "", tenant_claim: str = "tenant"
    ) -> JwtAuthenticator:
        """Load the key and choose the algorithms it can verify."""
        key, algorithms = load_jwt_key(read_file(path, "--jwt-key"), source=path)
        return cls(
            key, algorithms=algorithms, audience=audience, issuer=issuer, tenant_claim=tenant_claim
        )

    def authenticate(self, presented: Presented) -> Principal | None:
        token = presented.bearer
        if token is None or token.count(".") != 2:
            return None  # not a JWT: maybe another authenticator's token
        import jwt  # loaded by __init__: a look-up in sys.modules

        try:
            jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return None
        required = ["exp", "sub", "aud", *(["iss"] if self._issuer else [])]
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer or None,
                leeway=self.LEEWAY_S,
                options={"require": required},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("JWT expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("JWT audience not accepted") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("JWT issuer not accepted") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(f"JWT lacks the {exc.claim!r} claim") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthenticated("JWT algorithm not accepted") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("JWT signature does not verify") from None
        except jwt.PyJWTError as exc:
            # PyJWT's messages describe the token's shape, never its content.
            raise Unauthenticated(f"invalid JWT ({type(exc).__name__})") from None
        subject, tenant = claims.get("sub"), claims.get(self._tenant_claim, "")
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("JWT 'sub' must be a non-empty string")
        if not isinstance(tenant, str):
            raise Unauthenticated(f"JWT {self._tenant_claim!r} must be a string")
        return Principal(name=subject, tenant=tenant)


def load_jwt_key(data: bytes, *, source: str = "the JWT key") -> tuple[Any, list[str]]:
    """A verification key and the algorithms it may verify.

    A PEM public key (or certificate) picks RS*/PS* for RSA, ES* for EC and EdDSA for
    Ed25519/Ed448; anything else is an HMAC secret (HS256/384/512).
    """
    if b"-----BEGIN" in data:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

        public: Any
        try:
            if b"CERTIFICATE" in data:
                public = x509.load_pem_x509_certificate(data).public_key()
            else:
                public = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise UsageError(f"{source}: not a PEM public key or certificate") from exc
        if isinstance(public, rsa.RSAPublicKey):
            return public, ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]
        if isinstance(public, ec.EllipticCurvePublicKey):
            return public, ["ES256", "ES384", "ES512"]
        if isinstance(public, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            return public, ["EdDSA"]
        raise UsageError(f"{source}: unsupported key type {type(public).__name__}")
    secret = data.strip()
    if len(secret) < MIN_HMAC_KEY_BYTES:
        raise UsageError(f"{source}: an HMAC key needs at least {MIN_HMAC_KEY_BYTES} bytes")
    return secret, ["HS256", "HS384", "HS512"]


class MtlsAuthenticator:
    """The verified client certificate names the caller: its first subjectAltName
    (else its CN) is the principal, its subject O the tenant."""

    def authenticate(self, presented: Presented) -> Principal | None:
        if not presented.peer_identities:
            return None
        return Principal(name=presented.peer_identities[0], tenant=presented.peer_organization)


class ChainAuthenticator:
    """Tries each authenticator in turn and applies the precedence rules."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.replace(authenticators)

    def replace(self, authenticators: Sequence[Authenticator]) -> None:
        """Authenticate later calls with these (credential files reloaded)."""
        bearer = [a for a in authenticators if not isinstance(a, MtlsAuthenticator)]
        mtls = [a for a in authenticators if isinstance(a, MtlsAuthenticator)]
        # Called on the event loop, as authenticate is: a call sees the old pair or the new.
        self._bearer, self._mtls = bearer, mtls

    def authenticate(self, presented: Presented) -> Principal:
        """The caller, or ``Unauthenticated`` (never ``None``)."""
        principal = self._find(presented)
        if principal == ANONYMOUS:
            # It owns every session of a service run without authentication (and those
            # from before owners): a JWT or certificate naming it would own them too.
            raise Unauthenticated("the principal 'anonymous' is reserved")
        return principal

    def _find(self, presented: Presented) -> Principal:
        if presented.bearer is not None:
            if not presented.bearer:
                raise Unauthenticated("malformed authorization header: expected 'Bearer TOKEN'")
            if not self._bearer:
                raise Unauthenticated("this service does not accept bearer tokens")
            for authenticator in self._bearer:
                principal = authenticator.authenticate(presented)
                if principal is not None:
                    return principal
            raise Unauthenticated("invalid bearer token")
        for authenticator in self._mtls:
            principal = authenticator.authenticate(presented)
            if principal is not None:
                return principal
        if self._mtls and not self._bearer:
            raise Unauthenticated("missing credentials: present a client certificate")
        raise Unauthenticated("missing credentials: send 'authorization: Bearer TOKEN'")


def presented(context: grpc.aio.ServicerContext[Any, Any]) -> Presented:
    """What the call of ``context`` presented: its bearer token, its verified certificate."""
    bearer: str | None = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            # A malformed header is a bad credential, never none at all (and never
            # a token without its scheme).
            bearer = token.strip() if scheme.lower() == "bearer" else ""
            break
    identities = tuple(
        i.decode() if isinstance(i, bytes) else str(i) for i in context.peer_identities() or ()
    )
    organization = ""
    if identities:
        pem = list(context.auth_context().get("x509_pem_cert") or ())
        if pem:
            organization = _organization(pem[0])
    return Presented(bearer=bearer, peer_identities=identities, peer_organization=organization)


@functools.lru_cache(maxsize=256)
def _organization(pem: bytes) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    value = names[0].value if names else ""
    return value.decode() if isinstance(value, bytes) else value


def read_file(path: str, what: str) -> bytes:
    """``path``'s bytes (empty for no path); ``UsageError`` names ``what`` and why."""
    if not path:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from exc
