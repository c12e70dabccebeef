"""Whether a page of stored events holds the sequences of their entry ids, checked
without a Python step per event.

An append stores each event's bytes with the sequence the writer's fence implies
(field 1 leads) or, serialized by the store, with none. A page read with ``XRANGE``
is handed out as those bytes, so each must hold its entry's sequence: the keys
(``08`` and the varint) of the page's sequences, joined from cached blocks, are
compared with as many leading bytes of every event, taken and joined in C.
"""

from __future__ import annotations

import functools
import operator

from helix_transport._wire import SEQUENCE_KEY, varint

_BLOCK = 128
"""Sequences per cached block of keys: a key grows a byte at 2^7, 2^14...,
always at a block's start, so the keys of a block are all one length."""

# The first ``size`` bytes of an event (a key is 2-11 bytes), for ``map``.
_heads = {size: operator.itemgetter(slice(size)) for size in range(2, 12)}


@functools.lru_cache(maxsize=256)  # 32,768 sequences' keys, about 140 KB
def _block(index: int) -> bytes:
    start = index * _BLOCK
    return b"".join([SEQUENCE_KEY + varint(s) for s in range(start, start + _BLOCK)])


def _keys(first: int, count: int, size: int) -> bytes:
    """The keys of ``count`` sequences from ``first``, all ``size`` bytes, end to end."""
    blocks = range(first // _BLOCK, (first + count - 1) // _BLOCK + 1)
    offset = (first - blocks[0] * _BLOCK) * size
    return b"".join([_block(index) for index in blocks])[offset : offset + count * size]


def _holds_sequences(first: int, encoded: list[bytes]) -> bool:
    """Whether event ``i`` of ``encoded`` begins with the key of ``first + i``, for all."""
    start, count = 0, len(encoded)
    while start < count:  # in runs of one key length (one run unless the page spans 2^7k)
        size = len(varint(first + start)) + 1
        end = min(count, (1 << 7 * (size - 1)) - first)  # where the keys grow a byte
        run = encoded if (start, end) == (0, count) else encoded[start:end]
        if b"".join(map(_heads[size], run)) != _keys(first + start, end - start, size):
            return False
        start = end
    return True


def stamped(after: int, encoded: list[bytes]) -> list[bytes] | None:
    """``encoded``, the events after ``after`` in order, each with its sequence: put in
    front where an event has none; None when one holds another (``read`` restamps)."""
    if _holds_sequences(after + 1, encoded):
        return encoded  # the usual page: as the writer stored it
    for index, data in enumerate(encoded):
        key = SEQUENCE_KEY + varint(after + 1 + index)
        if not data.startswith(key):
            if data.startswith(SEQUENCE_KEY):
                return None
            encoded[index] = key + data
    return encoded
