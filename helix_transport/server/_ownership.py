"""Sessions belong to the principal (and tenant) that started them: each owner has a
namespace of session ids.

What it means for users:

- A session id is unique within its owner's namespace (tenant and principal), not
  across the service. Two owners may use one id; each gets a session of their own,
  and neither can tell that the other's exists. A ``Start`` never fails because
  another owner took the id first, so nobody can occupy the ids a parent will give
  its children.
- Another owner's ``Stream``, ``GetStatus``, ``Interrupt`` or ``Continue`` on an id
  finds nothing: the same lookup, the same ``NOT_FOUND`` and about the same time as
  for an id nobody uses.
- A service run without authentication (the ``anonymous`` owner) keeps bare ids, so
  its stores are unchanged. Upgrading a service to a release with namespaces makes
  an authenticated owner's existing sessions unreachable under their old keys: they
  were stored under their bare ids, which now belong to the anonymous namespace (and
  ``anonymous`` sees only its own sessions there). Let such sessions finish before
  the upgrade.

How: the servicer maps each request's session id to a storage key with
``storage_id`` once, at its boundary, and uses the key for every store access;
replies and errors carry the caller's id. An authenticated owner's key is a digest
of (tenant, principal), ``NAMESPACE_SEPARATOR`` and the id. The separator is outside
the session id alphabet, so no caller can name a key in another namespace.
"""

from __future__ import annotations

import hashlib
import re

from helix_transport._exceptions import InvalidArgument
from helix_transport.server import _validation as check
from helix_transport.server._identity import ANONYMOUS, Principal, current_principal
from helix_transport.store import SessionRecord

NAMESPACE_SEPARATOR = "/"
"""Between an owner's digest and the session id in a storage key: not in the id
alphabet ``[A-Za-z0-9_.:-]``, so a key's namespace is always its digest's."""

_DIGEST = re.compile(r"[0-9a-f]{32}")


def storage_id(principal: Principal, session_id: str) -> str:
    """The store's key of ``principal``'s session ``session_id`` (the bare id for
    ``anonymous``)."""
    if principal == ANONYMOUS:
        return session_id
    # Principal.key keeps tenant and name apart whatever they hold; 128 bits of it.
    digest = hashlib.sha256(principal.key.encode()).hexdigest()[:32]
    return f"{digest}{NAMESPACE_SEPARATOR}{session_id}"


def caller_id(key: str) -> str:
    """The session id a storage key was made from (``storage_id``'s inverse)."""
    return key.rpartition(NAMESPACE_SEPARATOR)[2]


def parent_id(value: str) -> str:
    """A valid ``StartRequest.parent_session_id``: a session id, or a storage key.

    A parent's run knows itself by its key (the loop, its tools and the children
    they start see the record), so an authenticated parent names itself by that.
    """
    digest, separator, session_id = value.rpartition(NAMESPACE_SEPARATOR)
    if separator and not _DIGEST.fullmatch(digest):
        raise InvalidArgument(
            "parent_session_id", f"a namespace must be 32 hex digits before {separator!r}"
        )
    check.session_id(session_id, field="parent_session_id")
    return value


def visible(record: SessionRecord) -> bool:
    """True when the caller owns ``record`` (records from before owners: ``anonymous``).

    Under namespaced keys only an owner's own sessions are found; this still hides,
    in the anonymous namespace, sessions that authenticated owners started before
    namespaces (stored under bare ids) from a service run without authentication.
    """
    principal = current_principal()
    owner = record.principal or ANONYMOUS.name
    return owner == principal.name and record.tenant == principal.tenant
