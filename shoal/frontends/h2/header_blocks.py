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
    dynamic table is as it was (a client's repeated calls send the same few bytes of indexes)."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._blocks: dict[bytes, tuple[tuple[object, int, int], Headers]] = {}

    def decode(self, block: bytes) -> Headers:
        state = self._table_state()
        cached = self._blocks.get(block)
        if cached is not None and cached[0] == state and cached[0][0] is state[0]:
            return cached[1]
        try:
            headers = cast(Headers, self._decoder.decode(block, raw=True))
        except hpack.HPACKError as exc:
            raise ConnectionError_(h2.COMPRESSION_ERROR, f"a bad header block: {exc}") from None
        after = self._table_state()
        if after == state and after[0] is state[0]:  # the block left the table alone
            if len(self._blocks) >= _BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = (state, headers)
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
