"""Who may call a service: bearer tokens (a token file, JWTs) and mutual TLS.

``AuthConfig`` says which credentials a service accepts (flags or environment);
``AuthConfig.load()`` reads the files into a ``ServerAuth``: an ``Authenticator`` and
the TLS server credentials. ``AuthInterceptor`` authenticates every RPC except
``grpc.health.v1`` (probes call it without credentials) and sets the caller's
``Principal`` for the handler (``current_principal()``), or answers
``UNAUTHENTICATED``. A running service picks up new contents of its token file, JWT
key and TLS files by itself (``CredentialReload``, below).

Fail closed: a service with no way to authenticate callers refuses to start unless
``allow_unauthenticated`` is set explicitly (``--allow-unauthenticated``).

Precedence on one call: a bearer token, when present, names the caller (a parent
service can forward its caller's token over its own mTLS connection); otherwise a
verified client certificate does; otherwise the call is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from helix_transport._exceptions import Unauthenticated, UsageError
from helix_transport.server._authenticators import (
    MIN_HMAC_KEY_BYTES,
    MIN_TOKEN_LENGTH,
    Authenticator,
    ChainAuthenticator,
    JwtAuthenticator,
    MtlsAuthenticator,
    Presented,
    TokenFileAuthenticator,
    load_jwt_key,
    presented,
    read_file,
)
from helix_transport.server._handlers import wrap_handler
from helix_transport.server._identity import set_principal
from helix_transport.transport import ClientAuth, ClientPool, read_token_file, set_bearer_token

__all__ = [
    "HEALTH_PREFIX",
    "MIN_HMAC_KEY_BYTES",
    "MIN_TOKEN_LENGTH",
    "AuthConfig",
    "AuthInterceptor",
    "Authenticator",
    "ChainAuthenticator",
    "ClientTokenReload",
    "CredentialReload",
    "JwtAuthenticator",
    "MtlsAuthenticator",
    "Presented",
    "ServerAuth",
    "TokenFileAuthenticator",
    "fingerprint",
    "load_jwt_key",
    "presented",
]

logger = logging.getLogger("helix.auth")

_Fingerprint = tuple[tuple[int, int, int] | None, ...]

HEALTH_PREFIX = "/grpc.health.v1.Health/"
"""RPCs under this prefix are served without credentials (Kubernetes probes)."""


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
        key = read_file(self.tls_key_file, "--tls-key")
        cert = read_file(self.tls_cert_file, "--tls-cert")
        _check_key_pair(key, cert, key_file=self.tls_key_file, cert_file=self.tls_cert_file)
        return [(key, cert)], read_file(self.tls_client_ca_file, "--tls-client-ca") or None

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


# Credential files picked up while a service runs, without a restart.
#
# Kubernetes updates a mounted Secret in place (an atomic swap of a symlink), and
# operators rotate tokens, JWT keys and certificates on their own schedule.
# ``CredentialReload.watch`` looks at the files' identity (inode, size, mtime) every
# ``AuthConfig.reload_interval_s`` and, when one changed, reads them all again off the
# event loop:
#
# - tokens and the JWT key replace the authenticators of later calls (calls already
#   admitted keep going: a stream is authenticated when it opens);
# - TLS files become the certificates of later handshakes (grpc asks ``certificates``
#   before each one; open connections keep theirs);
# - the token the service presents to its children (``--client-token-file``) is sent
#   with their later calls (``ClientTokenReload``).
#
# A change that does not load (a half-written file, a malformed line) is logged and the
# previous credentials stay: a bad edit neither locks every caller out nor lets anyone
# in. It is read again at the next change.


class CredentialReload:
    """Swaps in new contents of a service's credential files (see the module docstring)."""

    def __init__(self, config: AuthConfig, authenticator: ChainAuthenticator | None) -> None:
        self.config = config
        self.authenticator = authenticator
        """The chain the service authenticates with; its authenticators are replaced."""
        self.reloads = 0
        """Changes loaded so far (failed ones not counted)."""
        self._seen = fingerprint(config.files())
        self._certificates: grpc.ServerCertificateConfiguration | None = None
        # grpc calls ``certificates`` from its own threads, while ``check`` runs on the loop.
        self._lock = threading.Lock()

    def certificates(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's fetcher, called before each TLS handshake: new certificates once,
        then ``None`` (keep them). Returns at once: the files were read by ``watch``."""
        with self._lock:
            new, self._certificates = self._certificates, None
        return new

    async def watch(self) -> None:
        """Check the files every ``reload_interval_s`` until cancelled."""
        await _every(self.config.reload_interval_s, self.check)

    async def check(self) -> bool:
        """Load the files if they changed since last seen; True when a change was loaded."""
        seen = await asyncio.to_thread(fingerprint, self.config.files())
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            authenticators, certificates = await asyncio.to_thread(self._load)
        except UsageError as exc:
            logger.error("credential files changed but do not load (%s): kept the previous", exc)
            return False
        if self.authenticator is not None:
            self.authenticator.replace(authenticators)
        if certificates is not None:
            with self._lock:
                self._certificates = certificates
        self.reloads += 1
        logger.info("credential files reloaded (%s)", ", ".join(self.config.files()))
        return True

    def _load(self) -> tuple[list[Authenticator], grpc.ServerCertificateConfiguration | None]:
        authenticators = self.config.load_authenticators()
        if not self.config.tls_cert_file:
            return authenticators, None
        return authenticators, self.config.load_certificates()


class ClientTokenReload:
    """The token a service presents to its children, read again when its file changes."""

    def __init__(self, pool: ClientPool, auth: ClientAuth, *, interval_s: float) -> None:
        self.pool = pool
        self.auth = auth
        self.interval_s = interval_s
        self.reloads = 0
        """New tokens taken so far."""
        # Unknown until the first check: no file is read on the event loop. The first
        # check reads it, and a token changed since the start is taken then.
        self._seen: _Fingerprint | None = None

    async def watch(self) -> None:
        """Check the token file every ``interval_s`` until cancelled."""
        await _every(self.interval_s, self.check)

    async def check(self) -> bool:
        """Take the file's token if the file changed and holds a new one."""
        path = self.auth.token_file
        seen = await asyncio.to_thread(fingerprint, (path,))
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            token = await asyncio.to_thread(read_token_file, path)
        except UsageError as exc:
            logger.error("the client token file changed but does not load (%s): kept", exc)
            return False
        if token == self.auth.token:
            return False
        self.auth = dataclasses.replace(self.auth, token=token)
        self.pool.use_auth(self.auth)
        self.reloads += 1
        logger.info("client token reloaded (%s)", path)
        return True


async def _every(interval_s: float, check: Callable[[], Awaitable[bool]]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await check()
        except Exception:  # a surprise must not end reloading for the process's life
            logger.exception("checking the credential files failed; will check again")


def fingerprint(paths: Sequence[str]) -> _Fingerprint:
    """Each file's (inode, size, mtime); ``None`` for one that cannot be read now."""
    marks: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows the symlink a Secret volume swaps
        except OSError:
            marks.append(None)
            continue
        marks.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(marks)


if TYPE_CHECKING:  # grpc's classes are generic only in its stubs
    _Handler = grpc.RpcMethodHandler[Any, Any]


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


def _check_key_pair(key_pem: bytes, cert_pem: bytes, *, key_file: str, cert_file: str) -> None:
    """Refuse a key that is not the certificate's (grpc would fail every handshake,
    with nothing in its error to say why; while rotating, one file may land first)."""
    from cryptography import x509  # here: a service without TLS never loads it
    from cryptography.hazmat.primitives import serialization

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
