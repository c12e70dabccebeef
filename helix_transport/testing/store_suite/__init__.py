"""A conformance suite every ``Store`` backend must pass.

Subclass ``StoreConformance`` in a test module (its name must start with ``Test``)
and provide a ``store`` fixture that yields a fresh, empty store::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self) -> AsyncIterator[Store]:
            store = await MyStore.open(...)
            yield store
            await store.aclose()

Backends whose data outlives one store object (a restarted process, another
replica) subclass ``DurableStoreConformance`` instead and also provide ``reopen``:
an async callable opening a new instance on the same data.

The tests only use the ``Store`` Protocol, so they pin down behaviour, not storage.

The tests are split by the ``Store`` role they check (``_sessions``, ``_log``,
``_keyed``, ``_inputs``, ``_outbox``, ``_leases``, ``_retention``, ``_listing``) and
composed into ``StoreConformance``.
"""

from __future__ import annotations

from helix_transport.testing.store_suite._durable import DurableStoreConformance
from helix_transport.testing.store_suite._helpers import (
    Reopen,
    make_command,
    make_event,
    make_record,
)
from helix_transport.testing.store_suite._suite import StoreConformance

__all__ = [
    "DurableStoreConformance",
    "Reopen",
    "StoreConformance",
    "make_command",
    "make_event",
    "make_record",
]
