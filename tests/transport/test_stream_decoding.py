"""A ``Stream`` response that is not a ``StreamResponse`` is a clear error, in both the
parsed and the bytes-keeping (forwarding) modes of ``EventStream``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from helix_transport import AgentClient
from helix_transport._exceptions import RemoteError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.helpers import serve_stream


@pytest.fixture
async def junk_server() -> AsyncIterator[str]:
    """A server whose ``Stream`` sends bytes that do not parse as a ``StreamResponse``."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"\x0a\x05abc"  # events: a length past the end of the message

    async with serve_stream(stream) as address:
        yield address


async def _first(batches: AsyncIterator[Any]) -> Any:
    async for batch in batches:
        return batch
    return None


async def test_junk_is_a_remote_error_when_parsed(junk_server: str) -> None:
    async with await AgentClient.connect(junk_server) as client:
        with pytest.raises(RemoteError, match=r"DATA_LOSS.*not a StreamResponse"):
            await _first(client.stream("s-1").batches())


async def test_junk_is_a_remote_error_when_kept_as_bytes(junk_server: str) -> None:
    async with await AgentClient.connect(junk_server) as client:
        with pytest.raises(RemoteError, match=r"DATA_LOSS.*not a StreamResponse"):
            await _first(client.stream("s-1").encoded_batches())


def test_the_junk_really_is_not_a_stream_response() -> None:
    from google.protobuf.message import DecodeError

    with pytest.raises(DecodeError):
        pb.StreamResponse.FromString(b"\x0a\x05abc")
