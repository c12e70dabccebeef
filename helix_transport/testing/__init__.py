"""Public test kit: harnesses that let any code or backend prove it keeps the contracts.

``helix_transport.testing.store_suite.StoreConformance`` is the conformance suite every
``Store`` backend runs.
"""
