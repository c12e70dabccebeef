"""A DNS server on loopback whose answers a test changes: ``dns:///`` balancing, for real.

grpc's default resolver (c-ares) takes a DNS server in the target's authority:
``dns://127.0.0.1:PORT/replicas.test:50051`` asks this server, and only it, for
``replicas.test``, so a test can make one name resolve to several loopback addresses
(``127.0.0.1``, ``127.0.0.2``: all of ``127.0.0.0/8`` is local on Linux) and change the
answer while a channel is open, as a Kubernetes headless Service does when pods come
and go, without root or a hosts file. It answers ``A`` questions for any name with the
current addresses (TTL 0) and every other question with no record; it counts ``A``
questions, so a test can see that a client re-resolved.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from collections.abc import Sequence
from types import TracebackType
from typing import Self

_A, _IN = 1, 1
_HEADER = struct.Struct(">HHHHHH")  # id, flags, questions, answers, authority, additional


class LoopbackDns(asyncio.DatagramProtocol):
    """``async with LoopbackDns(["127.0.0.1"]) as dns:`` then dial ``dns.target(name, port)``."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        """The IPv4 addresses every ``A`` question gets, in this order (change it freely)."""
        self.a_queries = 0
        """``A`` questions answered so far."""
        self._transport: asyncio.DatagramTransport | None = None

    @property
    def port(self) -> int:
        """The UDP port it answers on (127.0.0.1)."""
        assert self._transport is not None, "not started"
        return int(self._transport.get_extra_info("sockname")[1])

    def target(self, name: str, port: int) -> str:
        """A gRPC target that resolves ``name`` through this server."""
        return f"dns://127.0.0.1:{self.port}/{name}:{port}"

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", 0)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._transport is not None:
            self._transport.close()

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        reply = self._answer(data)
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)

    def _answer(self, query: bytes) -> bytes | None:
        if len(query) < _HEADER.size:
            return None
        query_id, flags, questions, *_ = _HEADER.unpack_from(query)
        end = _HEADER.size
        while end < len(query) and query[end]:  # the question's name: length-prefixed labels
            end += 1 + query[end]
        if questions != 1 or end + 5 > len(query):
            return None
        qtype, qclass = struct.unpack_from(">HH", query, end + 1)
        question = query[_HEADER.size : end + 5]
        records = b""
        if qtype == _A and qclass == _IN:
            self.a_queries += 1
            for address in self.addresses:
                # A pointer to the question's name (offset 12), A, IN, TTL 0: never cached.
                records += struct.pack(">HHHIH", 0xC00C, _A, _IN, 0, 4)
                records += ipaddress.IPv4Address(address).packed
        count = len(records) // 16
        # A response (QR), authoritative (AA), recursion desired copied, available (RA).
        reply_flags = 0x8400 | (flags & 0x0100) | 0x0080
        return _HEADER.pack(query_id, reply_flags, 1, count, 0, 0) + question + records
