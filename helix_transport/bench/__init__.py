"""The helix-mesh benchmark suite: ``helix-mesh bench`` or ``python -m helix_transport.bench``.

Scenarios on 127.0.0.1, each figure beside a baseline measured in the same run (a
raw ``grpc.aio`` server-streaming RPC sending as many messages of the same size,
or the same agent's work in-process) and the issue's target for it:

1. one stream of live events; 2. replay of a finished log; 3. Start -> completed
round trip (1-3 per store: memory, sqlite, redis, postgres, that is 9);
4. two hops vs one (and delegation vs a local tool); 5. fan-out to 1,000
children; 6. 500 sessions streaming at once; 7. interrupt three levels;
8. recovery after SIGKILL of a child's service (restart, replica takeover).

Narrower measurements, each its own script with its own arguments and printout
(``python -m helix_transport.bench.<name> --help``): ``rejoin``, ``stream_cpu``,
``turn_lookup`` and ``two_hops``; docs/performance.md says what each measures.

Scripts, not timed tests: the default test suite only runs ``--quick`` and checks
the JSON's shape (tests/bench/test_smoke.py).
"""

from __future__ import annotations

from helix_transport.bench._main import main

__all__ = ["main"]
