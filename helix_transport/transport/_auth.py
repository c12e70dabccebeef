"""How a client proves who it is to an agent service: a bearer token, a client
certificate, or (for a parent service) its caller's token passed on."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from helix_transport._exceptions import Unauthenticated, UsageError

FORWARD = "forward"
"""Identity mode: present the incoming caller's token to children (own one as fallback)."""
SUBSTITUTE = "substitute"
"""Identity mode: present this service's own credential to children."""


_bearer: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "helix_bearer_token", default=None
)


def current_bearer_token() -> str | None:
    """The bearer token the RPC being handled presented, for a parent that forwards it.

    Only in memory: runs started by the RPC inherit it (asyncio copies the context
    into their tasks); a run resumed after a restart has none (never stored).
    """
    return _bearer.get()


def set_bearer_token(token: str | None) -> contextvars.Token[str | None]:
    """Set the current RPC's bearer token (the server's auth interceptor does)."""
    return _bearer.set(token)


@dataclass(frozen=True, kw_only=True)
class ClientAuth:
    """Credentials sent with every call of an ``AgentClient`` (or a service's pool).

    ``repr`` never shows the token or the private key.
    """

    token: str = field(default="", repr=False)
    """Bearer token sent as ``authorization: Bearer TOKEN``."""
    tls_ca: bytes = field(default=b"", repr=False)
    """Root certificates (PEM) to verify the server by; TLS when set (or with a cert)."""
    tls_cert: bytes = field(default=b"", repr=False)
    """Client certificate chain (PEM), for mutual TLS."""
    tls_key: bytes = field(default=b"", repr=False)
    """Client private key (PEM)."""
    tls_server_name: str = ""
    """Expected server name when it differs from the address's host."""
    identity: str = SUBSTITUTE
    """``substitute`` (send ``token``) or ``forward`` (send the current RPC's caller
    token when there is one, else ``token``)."""
    token_file: str = ""
    """The file ``token`` was read from (``from_files``): a service reads it again
    when it changes (``helix_transport.server._reload``)."""

    def __post_init__(self) -> None:
        if self.identity not in (FORWARD, SUBSTITUTE):
            raise UsageError(f"identity must be {FORWARD!r} or {SUBSTITUTE!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UsageError("a client certificate needs its key (and the key its certificate)")

    @property
    def tls(self) -> bool:
        """True when calls go over TLS."""
        return bool(self.tls_ca or self.tls_cert)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials for the channel; ``None`` for plaintext."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.tls_ca or None,
            private_key=self.tls_key or None,
            certificate_chain=self.tls_cert or None,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options (the TLS server name override)."""
        if self.tls and self.tls_server_name:
            return [("grpc.ssl_target_name_override", self.tls_server_name)]
        return []

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata for one call, read in the calling task.

        Raises:
            Unauthenticated: in ``forward`` mode with no caller token to forward and
                no credential of its own (a run resumed after a restart, whose
                caller's token was never stored).
        """
        token = self.token
        if self.identity == FORWARD:
            token = current_bearer_token() or token
            if not token and not self.tls_cert:
                raise Unauthenticated(
                    "no caller credential to forward (a run resumed after a restart has "
                    "none: tokens are never stored) and no credential of this service's own "
                    "(HELIX_CLIENT_TOKEN_FILE or a client certificate)"
                )
        return (("authorization", f"Bearer {token}"),) if token else ()

    @classmethod
    def from_files(
        cls,
        *,
        token: str = "",
        token_file: str = "",
        tls_ca_file: str = "",
        tls_cert_file: str = "",
        tls_key_file: str = "",
        tls_server_name: str = "",
        identity: str = SUBSTITUTE,
    ) -> ClientAuth | None:
        """Read the named files (blocking; small); ``None`` when nothing is configured."""
        if token_file:
            token = read_token_file(token_file)
        auth = cls(
            token=token,
            token_file=token_file,
            tls_ca=_read(tls_ca_file, "TLS CA"),
            tls_cert=_read(tls_cert_file, "TLS certificate"),
            tls_key=_read(tls_key_file, "TLS key"),
            tls_server_name=tls_server_name,
            identity=identity,
        )
        if not (auth.token or auth.tls or auth.identity == FORWARD):
            return None
        return auth


def read_token_file(path: str) -> str:
    """The token a file holds (blocking; small).

    Raises:
        UsageError: the file cannot be read, is not UTF-8 text or holds nothing.
    """
    try:
        token = _read(path, "token file").decode().strip()
    except UnicodeDecodeError:
        raise UsageError(f"token file {path}: not UTF-8 text") from None
    if not token:
        raise UsageError(f"token file {path} is empty")
    return token


def _read(path: str, what: str) -> bytes:
    if not path:
        return b""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from exc


class _AuthMetadata:
    """Adds ``ClientAuth.metadata()`` to a call's metadata."""

    def __init__(self, auth: ClientAuth) -> None:
        self._auth = auth

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._auth.metadata())
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# A class a kind: a channel files each interceptor under one kind only (an if/elif chain).
class _UnaryAuth(_AuthMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamAuth(_AuthMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def open_channel(
    address: str, auth: ClientAuth | None, *, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """A channel to ``address`` that presents ``auth`` on every call (plaintext when None)."""
    options = [*(options or []), *(auth.channel_options() if auth else [])]
    interceptors: list[grpc.aio.ClientInterceptor] | None = None
    if auth is not None:
        interceptors = [_UnaryAuth(auth), _StreamAuth(auth), _BidiAuth(auth)]
    credentials = auth.channel_credentials() if auth is not None else None
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


class _BidiAuth(_AuthMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)
