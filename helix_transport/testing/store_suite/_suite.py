"""``StoreConformance``: every role's tests, composed as ``Store`` composes its roles."""

from __future__ import annotations

import pytest

from helix_transport.testing.store_suite._inputs import InputConformance
from helix_transport.testing.store_suite._keyed import KeyedStateConformance
from helix_transport.testing.store_suite._leases import LeaseConformance
from helix_transport.testing.store_suite._listing import ListingConformance
from helix_transport.testing.store_suite._log import EventLogConformance
from helix_transport.testing.store_suite._outbox import OutboxConformance
from helix_transport.testing.store_suite._retention import RetentionConformance
from helix_transport.testing.store_suite._sessions import SessionConformance


class StoreConformance(
    SessionConformance,
    EventLogConformance,
    KeyedStateConformance,
    InputConformance,
    OutboxConformance,
    LeaseConformance,
    RetentionConformance,
    ListingConformance,
):
    """The ``Store`` contract as tests; needs a ``store`` fixture (see the package docstring)."""

    # Lets the suite run in projects whose pytest-asyncio is in strict mode.
    pytestmark = pytest.mark.asyncio
