"""What a helix A2A stream delivered, by the sequences of the root's log: an update
covers ``metadata.helix.first_sequence`` (when present: text deltas joined) to
``metadata.helix.sequence``."""

from __future__ import annotations

from collections.abc import Iterable

from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format

from helix_transport.a2a.mapping import TEXT_ARTIFACT


def covered(event: a2a.StreamResponse) -> tuple[int, int] | None:
    """``(first, last)`` sequence an update covers; None for the Task snapshot."""
    for field in ("status_update", "artifact_update"):
        if event.HasField(field):
            helix = json_format.MessageToDict(getattr(event, field).metadata)["helix"]
            last = int(helix["sequence"])
            return int(helix.get("first_sequence", last)), last
    return None


def sequences(events: Iterable[a2a.StreamResponse]) -> list[int]:
    """Every sequence the updates cover, in the order delivered."""
    found: list[int] = []
    for event in events:
        span = covered(event)
        if span is not None:
            found += range(span[0], span[1] + 1)
    return found


def is_text(event: a2a.StreamResponse) -> bool:
    """Whether ``event`` is a chunk of the root's ``text`` artifact."""
    return (
        event.HasField("artifact_update")
        and event.artifact_update.artifact.artifact_id == TEXT_ARTIFACT
    )


def text(events: Iterable[a2a.StreamResponse]) -> str:
    """The ``text`` artifact as the updates build it."""
    return "".join(p.text for e in events if is_text(e) for p in e.artifact_update.artifact.parts)
