"""Credential files picked up while a service runs, without a restart.

Kubernetes updates a mounted Secret in place (an atomic swap of a symlink), and
operators rotate tokens, JWT keys and certificates on their own schedule.
``CredentialReload.watch`` looks at the files' identity (inode, size, mtime) every
``AuthConfig.reload_interval_s`` and, when one changed, reads them all again off the
event loop:

- tokens and the JWT key replace the authenticators of later calls (calls already
  admitted keep going: a stream is authenticated when it opens);
- TLS files become the certificates of later handshakes (grpc asks ``certificates``
  before each one; open connections keep theirs);
- the token the service presents to its children (``--client-token-file``) is sent
  with their later calls (``ClientTokenReload``).

A change that does not load (a half-written file, a malformed line) is logged and the
previous credentials stay: a bad edit neither locks every caller out nor lets anyone
in. It is read again at the next change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence

import grpc

from helix_transport._exceptions import UsageError
from helix_transport.server.auth import AuthConfig, Authenticator, ChainAuthenticator
from helix_transport.transport._auth import ClientAuth, read_token_file
from helix_transport.transport._pool import ClientPool

logger = logging.getLogger("helix.auth")

_Fingerprint = tuple[tuple[int, int, int] | None, ...]


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
