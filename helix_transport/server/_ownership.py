"""Sessions belong to the principal (and tenant) that started them.

Another principal's ``Stream``, ``GetStatus``, ``Interrupt`` or ``Continue`` on a
session gets ``NOT_FOUND`` with the same message as for a session that does not
exist, so ids reveal nothing. A ``Start`` reusing another principal's id gets
``ALREADY_EXISTS`` with the same message as a different input under one's own id:
the id is taken, which the caller must learn, and nothing more.
"""

from __future__ import annotations

from helix_transport.server._identity import ANONYMOUS, current_principal
from helix_transport.store import SessionRecord


def visible(record: SessionRecord) -> bool:
    """True when the caller owns ``record`` (records from before owners: ``anonymous``)."""
    principal = current_principal()
    owner = record.principal or ANONYMOUS.name
    return owner == principal.name and record.tenant == principal.tenant
