"""Received header blocks: HPACK decoding (the ``hpack`` library) with a cache of blocks seen."""

from __future__ import annotations

from typing import Any, Final, cast

import hpack

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.errors import ConnectionError_

#: Largest header list accepted (names + values + 32 bytes per field, as RFC 9113 counts).
MAX_HEADER_LIST: Final = 1 << 16

Headers = list[tuple[bytes, bytes]]

#: Decoded header blocks remembered per connection.
_BLOCK_CACHE: Final = 64


class HeaderDecoder:
    """One connection's HPACK decoder. A block seen before is not decoded again while the
    dynamic table is as it was (a client's repeated calls send the same few bytes of indexes).

    Every block goes through :meth:`decode`, and a block found in the cache is not decoded, so
    the table changes only in a decode that misses: one that leaves it changed empties the
    cache, and every block kept was decoded against the table as it is. A hit is then one
    dictionary look-up (the table's state read and compared cost ~1,500 instructions more)."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._blocks: dict[bytes, Headers] = {}

    def decode(self, block: bytes) -> Headers:
        cached = self._blocks.get(block)
        if cached is not None:
            return cached
        state = self._table_state()
        try:
            headers = cast(Headers, self._decoder.decode(block, raw=True))
        except hpack.HPACKError as exc:
            self._blocks.clear()  # the table may be half changed (the connection ends anyway)
            raise ConnectionError_(h2.COMPRESSION_ERROR, f"a bad header block: {exc}") from None
        after = self._table_state()
        if after != state or after[0] is not state[0]:
            self._blocks.clear()  # the block changed the table: those kept read the old one
        else:  # the block left the table alone
            if len(self._blocks) >= _BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = headers
        return headers

    def _table_state(self) -> tuple[object, int, int]:
        """What identifies the dynamic table: an insertion puts a new entry first (a new object:
        the cache holds the old one, so its identity cannot be reused); an eviction alone needs
        a size update. The table is read as ``Any``: mypyc would rebuild a typed entry (a
        ``tuple[bytes, bytes]``) into a new object on each read, and ``is`` would never hold."""
        table: Any = self._decoder.header_table
        entries = table.dynamic_entries
        first: object = entries[0] if entries else None
        return (first, len(entries), table.maxsize)
