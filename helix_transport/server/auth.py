"""Who may call a service: bearer tokens (a token file, JWTs) and mutual TLS.

``AuthConfig`` says which credentials a service accepts (flags or environment);
``AuthConfig.load()`` reads the files into a ``ServerAuth``: an ``Authenticator`` and
the TLS server credentials. ``AuthInterceptor`` authenticates every RPC except
``grpc.health.v1`` (probes call it without credentials) and sets the caller's
``Principal`` for the handler (``current_principal()``), or answers
``UNAUTHENTICATED``. A running service picks up new contents of its token file, JWT
key and TLS files by itself (``helix_transport.server._reload``).

Fail closed: a service with no way to authenticate callers refuses to start unless
``allow_unauthenticated`` is set explicitly (``--allow-unauthenticated``).

Precedence on one call: a bearer token, when present, names the caller (a parent
service can forward its caller's token over its own mTLS connection); otherwise a
verified client certificate does; otherwise the call is refused.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import logging
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import grpc
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID

from helix_transport._exceptions import Unauthenticated, UsageError
from helix_transport.server._handlers import wrap_handler
from helix_transport.server._identity import ANONYMOUS, Principal, set_principal
from helix_transport.transport._auth import set_bearer_token

logger = logging.getLogger("helix.auth")

HEALTH_PREFIX = "/grpc.health.v1.Health/"
"""RPCs under this prefix are served without credentials (Kubernetes probes)."""

MIN_TOKEN_LENGTH = 16
"""Shorter tokens in a token file are refused: they could be guessed."""

MIN_HMAC_KEY_BYTES = 32
"""An HS256 key shorter than this is refused (RFC 7518 asks for at least 256 bits)."""


@dataclass(frozen=True, kw_only=True)
class AuthConfig:
    """Which credentials a service accepts. Paths only: ``load()`` reads them."""

    tokens_file: str = ""
    """A token file: one ``TOKEN PRINCIPAL [TENANT]`` per line, ``#`` comments."""
    jwt_key_file: str = ""
    """The JWT verification key: a PEM public key (RS*/PS*, ES*, EdDSA) or a file
    holding an HMAC secret (HS256/384/512, at least 32 bytes)."""
    jwt_audience: str = ""
    """The ``aud`` a JWT must carry; required with ``jwt_key_file``."""
    jwt_issuer: str = ""
    """The ``iss`` a JWT must carry; not checked when empty."""
    jwt_tenant_claim: str = "tenant"
    """The JWT claim holding the caller's tenant (``sub`` is the principal)."""
    tls_cert_file: str = ""
    """The server's certificate chain (PEM); serves TLS when set."""
    tls_key_file: str = ""
    """The server's private key (PEM)."""
    tls_client_ca_file: str = ""
    """CA bundle for client certificates: enables mutual TLS, the certificate's first
    subjectAltName (else its CN) becomes the principal and its O the tenant."""
    allow_unauthenticated: bool = False
    """Serve without authentication (every caller is ``anonymous``): loopback demos
    and tests only. Must be explicit."""
    reload_interval_s: float = 10.0
    """How often a running service looks for new contents of the files above (a
    Kubernetes Secret is updated in place); 0 reads them only at start."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AuthConfig:
        """Read ``HELIX_AUTH_*``/``HELIX_JWT_*``/``HELIX_TLS_*``; ``overrides`` win when truthy."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "tokens_file": env.get("HELIX_AUTH_TOKENS_FILE", ""),
            "jwt_key_file": env.get("HELIX_JWT_KEY_FILE", ""),
            "jwt_audience": env.get("HELIX_JWT_AUDIENCE", ""),
            "jwt_issuer": env.get("HELIX_JWT_ISSUER", ""),
            "jwt_tenant_claim": env.get("HELIX_JWT_TENANT_CLAIM", "") or "tenant",
            "tls_cert_file": env.get("HELIX_TLS_CERT_FILE", ""),
            "tls_key_file": env.get("HELIX_TLS_KEY_FILE", ""),
            "tls_client_ca_file": env.get("HELIX_TLS_CLIENT_CA_FILE", ""),
            "allow_unauthenticated": _truthy(env.get("HELIX_ALLOW_UNAUTHENTICATED", "")),
        }
        if interval := env.get("HELIX_AUTH_RELOAD_INTERVAL_S", "").strip():
            try:
                values["reload_interval_s"] = float(interval)
            except ValueError:
                raise UsageError(
                    f"HELIX_AUTH_RELOAD_INTERVAL_S must be a number of seconds, not {interval!r}"
                ) from None
        values.update({k: v for k, v in overrides.items() if v})
        return cls(**values)

    @property
    def authenticates(self) -> bool:
        """True when at least one way to authenticate callers is configured."""
        return bool(self.tokens_file or self.jwt_key_file or self.tls_client_ca_file)

    def check(self) -> None:
        """Refuse an incomplete or open configuration (fail closed).

        Raises:
            UsageError: naming what is missing.
        """
        if not (math.isfinite(self.reload_interval_s) and self.reload_interval_s >= 0):
            raise UsageError(
                "the credential reload interval (HELIX_AUTH_RELOAD_INTERVAL_S) must be 0 "
                f"(off) or a positive number of seconds, not {self.reload_interval_s}"
            )
        if self.jwt_key_file and not self.jwt_audience:
            raise UsageError("--jwt-key needs --jwt-audience (HELIX_JWT_AUDIENCE)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise UsageError("--tls-cert and --tls-key go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise UsageError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if not self.authenticates and not self.allow_unauthenticated:
            raise UsageError(
                "refusing to start without authentication: configure --auth-tokens "
                "(HELIX_AUTH_TOKENS_FILE), --jwt-key with --jwt-audience, or --tls-client-ca "
                "(mutual TLS); or pass --allow-unauthenticated explicitly (loopback only)"
            )

    def load(self) -> ServerAuth:
        """Read the configured files (blocking: call it off the event loop).

        Raises:
            UsageError: a file is missing or malformed (never quoting a secret).
        """
        self.check()
        authenticators = self.load_authenticators()
        chain = ChainAuthenticator(authenticators) if authenticators else None
        credentials = None
        reload = None
        if self.reload_interval_s > 0 and self.files():
            from helix_transport.server._reload import CredentialReload  # it imports this module

            reload = CredentialReload(self, chain)
        if self.tls_cert_file:
            # With a client CA the handshake requires a verified client certificate
            # (grpc has no "ask but do not require"); health probes, which cannot
            # present one, use the plaintext health port (ServerConfig.health_port).
            # Reloading: grpc asks ``reload.certificates`` before every handshake.
            required = bool(self.tls_client_ca_file)
            if reload is not None:
                credentials = grpc.dynamic_ssl_server_credentials(
                    self.load_certificates(),
                    # grpc documents None as "no change"; its stubs do not allow it.
                    reload.certificates,  # type: ignore[arg-type]
                    required,
                )
            else:
                key_and_cert, roots = self._key_and_roots()
                credentials = grpc.ssl_server_credentials(
                    key_and_cert, root_certificates=roots, require_client_auth=required
                )
        if not authenticators:
            logger.warning(
                "authentication is OFF (--allow-unauthenticated): every caller is 'anonymous'; "
                "serve on loopback or a private network only"
            )
        return ServerAuth(
            authenticator=chain,
            server_credentials=credentials,
            reload=reload,
            reload_interval_s=self.reload_interval_s,
        )

    def files(self) -> tuple[str, ...]:
        """The credential files a service reads, in a fixed order."""
        paths = (
            self.tokens_file,
            self.jwt_key_file,
            self.tls_cert_file,
            self.tls_key_file,
            self.tls_client_ca_file,
        )
        return tuple(p for p in paths if p)

    def load_certificates(self) -> grpc.ServerCertificateConfiguration:
        """The TLS files as a certificate configuration (blocking)."""
        key_and_cert, roots = self._key_and_roots()
        return grpc.ssl_server_certificate_configuration(key_and_cert, root_certificates=roots)

    def _key_and_roots(self) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        key = _read(self.tls_key_file, "--tls-key")
        cert = _read(self.tls_cert_file, "--tls-cert")
        _check_key_pair(key, cert, key_file=self.tls_key_file, cert_file=self.tls_cert_file)
        return [(key, cert)], _read(self.tls_client_ca_file, "--tls-client-ca") or None

    def load_authenticators(self) -> list[Authenticator]:
        """The token file, JWT key and mutual TLS as authenticators (blocking).

        Raises:
            UsageError: a file is missing or malformed (never quoting a secret).
        """
        authenticators: list[Authenticator] = []
        if self.tokens_file:
            authenticators.append(TokenFileAuthenticator.from_file(self.tokens_file))
        if self.jwt_key_file:
            authenticators.append(
                JwtAuthenticator.from_key_file(
                    self.jwt_key_file,
                    audience=self.jwt_audience,
                    issuer=self.jwt_issuer,
                    tenant_claim=self.jwt_tenant_claim,
                )
            )
        if self.tls_client_ca_file:
            authenticators.append(MtlsAuthenticator())
        return authenticators


@dataclass(frozen=True)
class ServerAuth:
    """A loaded ``AuthConfig``: how to check callers and how to listen."""

    authenticator: ChainAuthenticator | None
    """``None`` when unauthenticated access was allowed explicitly."""
    server_credentials: grpc.ServerCredentials | None = None
    """TLS server credentials; ``None`` serves plaintext."""
    reload: CredentialReload | None = None
    """Picks up new contents of the credential files while the service runs
    (``AgentServer`` runs its ``watch``); ``None`` when reloading is off."""
    reload_interval_s: float = 0.0
    """``AuthConfig.reload_interval_s`` (0: off), for the client token file too."""


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
            text = _read(path, "--auth-tokens").decode("utf-8-sig")  # a BOM is no token's
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
        key, algorithms = load_jwt_key(_read(path, "--jwt-key"), source=path)
        return cls(
            key, algorithms=algorithms, audience=audience, issuer=issuer, tenant_claim=tenant_claim
        )

    def authenticate(self, presented: Presented) -> Principal | None:
        token = presented.bearer
        if token is None or token.count(".") != 2:
            return None  # not a JWT: maybe another authenticator's token
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
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    value = names[0].value if names else ""
    return value.decode() if isinstance(value, bytes) else value


if TYPE_CHECKING:  # grpc's classes are generic only in its stubs
    _Handler = grpc.RpcMethodHandler[Any, Any]

    from helix_transport.server._reload import CredentialReload


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every RPC but health checks; sets the principal for the handler.

    Install it first (outermost), so the principal is set before any other
    interceptor (limits, error mapping) or handler runs. A failure is answered with
    ``UNAUTHENTICATED`` directly, for every kind of RPC (reflection is bidi).
    """

    def __init__(self, authenticator: ChainAuthenticator) -> None:
        self._authenticator = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(HEALTH_PREFIX):
            return handler

        async def before(request: Any, context: _Context) -> Any:
            await self._authenticate(context, method)
            return request

        return wrap_handler(handler, before=before)

    async def _authenticate(self, context: _Context, method: str) -> None:
        seen = presented(context)
        try:
            principal = self._authenticator.authenticate(seen)
        except Unauthenticated as exc:
            logger.info("refused %s from %s: %s", method, context.peer(), exc.message)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            raise  # abort() raises; this is for the type checker
        set_principal(principal)
        # Kept in memory for the RPC and the runs it starts (a forwarding parent
        # presents it to children); never logged, never stored.
        set_bearer_token(seen.bearer)


_Context = grpc.aio.ServicerContext[Any, Any]


def _read(path: str, what: str) -> bytes:
    if not path:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from exc


def _check_key_pair(key_pem: bytes, cert_pem: bytes, *, key_file: str, cert_file: str) -> None:
    """Refuse a key that is not the certificate's (grpc would fail every handshake,
    with nothing in its error to say why; while rotating, one file may land first)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise UsageError(f"--tls-cert {cert_file}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise UsageError(f"--tls-key {key_file}: not an unencrypted PEM private key") from None
    form = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*form) != cert.public_key().public_bytes(*form):
        raise UsageError(f"--tls-key {key_file} is not the key of --tls-cert {cert_file}")


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")
