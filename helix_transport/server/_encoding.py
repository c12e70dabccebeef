"""``Stream`` responses encoded straight from their events' bytes.

Building a ``StreamResponse`` message copies every event into it before grpc
serializes the copy: 2.2 us per event in a micro-benchmark, against 0.45 us for
serializing each event and framing the bytes here (and the event log's writer has
already serialized each event once, for the store: those are the bytes). The wire
form of ``StreamResponse.events`` is simply each event's bytes behind a field
header, so the servicer yields ready ``bytes`` and the ``Stream`` serializer passes
them through (it still serializes messages, e.g. heartbeats).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport._wire import varint

MAX_RESPONSE_BYTES = 1 << 20
"""Events are packed into one ``StreamResponse`` up to this size (or half the server's
``max_message_bytes``, when that is smaller: one event may take up that half)."""

_EVENTS_KEY = b"\x0a"
"""``StreamResponse.events``: field 1, length-delimited."""
_SHORT_HEADS = [_EVENTS_KEY + bytes((n,)) for n in range(0x80)]


def _head(size: int) -> bytes:
    """The field header of an event of ``size`` bytes: key, then the size as a varint."""
    return _SHORT_HEADS[size] if size < 0x80 else _EVENTS_KEY + varint(size)


def encode_responses(encoded: Sequence[bytes], most: int = MAX_RESPONSE_BYTES) -> list[bytes]:
    """Serialized events as encoded ``StreamResponse`` messages, split only where one
    would pass ``most`` bytes (an event larger than that goes alone)."""
    count = len(encoded)
    if count == 1:  # a live stream's usual response (alone, whatever its size)
        data = encoded[0]
        return [_head(len(data)) + data]
    if count > 16:  # a reader behind: a batch that fits one response is joined in one call
        heads = [
            _SHORT_HEADS[n] if n < 0x80 else _EVENTS_KEY + varint(n) for n in map(len, encoded)
        ]
        if sum(map(len, heads)) + sum(map(len, encoded)) <= most:
            return [b"".join(chain.from_iterable(zip(heads, encoded, strict=False)))]
    responses: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for data in encoded:
        head = _head(len(data))
        if parts and size + len(head) + len(data) > most:
            responses.append(b"".join(parts))
            parts, size = [], 0
        parts += (head, data)
        size += len(head) + len(data)
    if parts:
        responses.append(b"".join(parts))
    return responses


def _serialize_stream_response(response: pb.StreamResponse | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


class _PassEncodedStreamResponses:
    """Stands in for the server while the generated code registers the service, so
    ``Stream`` gets a serializer that passes ``encode_responses`` output through."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        # Registered below from the same method table, once Stream's serializer is set.
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        for name in ("Stream", "Follow"):
            handlers[name] = handlers[name]._replace(response_serializer=_serialize_stream_response)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self._server.add_registered_method_handlers(service, handlers)


def add_agent_service(servicer: pb_grpc.AgentServiceServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer`` on ``server``: the generated registration, with ``Stream``
    and ``Follow`` responses that may be pre-encoded ``bytes``."""
    pb_grpc.add_AgentServiceServicer_to_server(servicer, _PassEncodedStreamResponses(server))  # type: ignore[arg-type]
