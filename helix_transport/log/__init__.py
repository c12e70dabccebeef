"""The event log of a session: one writer, a hub for live readers, and ``follow``.

- ``writer``: ``SessionWriter``, the one writer of a session (group commit, fenced appends).
- ``hub``: ``EventHub``, in-process fan-out of fresh events to local readers.
- ``follow``: replay from the store, then live from the hub (or the store, for writers
  in other processes).
"""

from __future__ import annotations

from helix_transport.log.follow import follow
from helix_transport.log.hub import Batch, EventHub
from helix_transport.log.writer import SessionWriter

__all__ = ["Batch", "EventHub", "SessionWriter", "follow"]
