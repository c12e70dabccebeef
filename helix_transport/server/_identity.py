"""Who is calling: the authenticated principal of the current RPC.

The authentication interceptor sets it; handlers, limits and ownership checks read
it. A service started with ``--allow-unauthenticated`` sees ``ANONYMOUS``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Principal:
    """An authenticated caller. Never holds the credential itself."""

    name: str
    """Who: a token file's principal, a JWT ``sub``, a client certificate's identity."""
    tenant: str = ""
    """The tenant the principal belongs to; empty when the deployment has none."""

    @property
    def key(self) -> str:
        """A stable key for per-principal state (rate limits), one per (tenant, name):
        both may hold '/' (URI and e-mail names do), so the tenant's length leads."""
        return f"{len(self.tenant)}:{self.tenant}/{self.name}"


ANONYMOUS = Principal(name="anonymous")
"""The principal of every call on a service that allows unauthenticated access."""

_current: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "helix_principal", default=ANONYMOUS
)


def current_principal() -> Principal:
    """The principal of the RPC being handled (``ANONYMOUS`` outside of one)."""
    return _current.get()


def set_principal(principal: Principal) -> contextvars.Token[Principal]:
    """Set the principal for the rest of this RPC's task; returns a reset token."""
    return _current.set(principal)
