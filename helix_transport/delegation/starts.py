"""A window of ``Start``s in flight from this process to each child service.

A parent that fans out to 1,000 children in one step sent 1,000 ``Start``s at once. The
child's service creates sessions one at a time (each is a store write), so most of them
waited in flight: ~24 KB of grpc state each in the parent and ~20 KB in the child's
service, and on the child's side as many sessions begun at once. At most
``START_WINDOW`` in flight keep that service as busy: at 1,000 children the same wall
time at 64 (16 was 1.3x slower), the parent peaking ~18 MiB above its idle RSS instead of
~36 and the child's service ~16 instead of ~38 (docs/performance.md, fan-out memory).

A remote tool's ``Start`` and a ``run_subagent`` task's ``Start`` or ``Continue`` wait for
a slot (a companion, started one at a time, does not): a started child runs and streams
without one, so children still run all at once. The wait is inside the call's timeout and
is cancelled with it; the child's ref is saved before, as for a ``Start`` in flight (an
interrupt finds it, see ``cascade``).
"""

from __future__ import annotations

import asyncio
import weakref

from helix_transport.transport import AgentClient

START_WINDOW = 64
"""``Start``s (and ``Continue``s) in flight at once from this process to one child service
(one ``AgentClient`` of the pool: one address, however many replicas answer there)."""

_windows: weakref.WeakKeyDictionary[AgentClient, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def start_window(client: AgentClient) -> asyncio.Semaphore:
    """The window of ``client``'s service: hold it around the ``Start``, not the stream."""
    window = _windows.get(client)
    if window is None:
        window = _windows[client] = asyncio.Semaphore(START_WINDOW)
    return window
