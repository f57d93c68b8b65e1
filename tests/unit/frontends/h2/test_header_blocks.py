"""Received header blocks: a repeated block is decoded once while the HPACK dynamic table stays
as it was, and every block decodes to what a fresh decoder fed the same blocks says."""

from __future__ import annotations

import random

import hpack
import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.errors import ConnectionError_
from shoal.frontends.h2.header_blocks import HeaderDecoder

pytestmark = pytest.mark.timeout(30)

HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _inserting(name: bytes, value: bytes) -> bytes:
    """A literal with incremental indexing and a new name: the field joins the dynamic table."""
    return b"\x40" + bytes((len(name),)) + name + bytes((len(value),)) + value


#: Indexed fields 62 and 63: the newest and the second newest entry of the dynamic table.
NEWEST, SECOND = b"\xbe", b"\xbf"
#: Dynamic table size updates: to 0 (every entry evicted) and back to 4096.
TABLE_EMPTIED, TABLE_RESTORED = b"\x20", b"\x3f\xe1\x1f"


def test_a_repeated_block_gives_the_same_headers_and_is_decoded_once() -> None:
    encoder = hpack.Encoder()
    first, repeated = encoder.encode(HEADERS), encoder.encode(HEADERS)
    assert first != repeated  # the second refers to the entries the first put in the table
    decoder = HeaderDecoder()
    decoder.decode(first)
    headers = decoder.decode(repeated)
    assert headers == [(n.encode(), v.encode()) for n, v in HEADERS]
    assert decoder.decode(repeated) is headers  # the cached list, not a second decode


def test_a_block_that_refers_to_the_table_is_decoded_again_after_the_table_changed() -> None:
    decoder = HeaderDecoder()
    decoder.decode(_inserting(b"x-a", b"1"))
    assert decoder.decode(NEWEST) == [(b"x-a", b"1")]
    assert decoder.decode(NEWEST) == [(b"x-a", b"1")]
    decoder.decode(_inserting(b"x-b", b"2"))
    assert decoder.decode(NEWEST) == [(b"x-b", b"2")]
    assert decoder.decode(SECOND) == [(b"x-a", b"1")]


def test_a_block_that_refers_to_an_evicted_entry_fails_though_it_was_cached() -> None:
    decoder = HeaderDecoder()
    decoder.decode(_inserting(b"x-a", b"1"))
    assert decoder.decode(NEWEST) == [(b"x-a", b"1")]
    assert decoder.decode(TABLE_EMPTIED + TABLE_RESTORED) == []
    with pytest.raises(ConnectionError_) as raised:
        decoder.decode(NEWEST)
    assert raised.value.code == h2.COMPRESSION_ERROR


def test_a_block_that_inserts_is_applied_every_time() -> None:
    decoder = HeaderDecoder()
    block = _inserting(b"x-a", b"1")
    decoder.decode(block)
    decoder.decode(block)
    assert decoder.decode(SECOND) == [(b"x-a", b"1")]  # two entries: it was decoded twice


def _reference(decoder: hpack.Decoder, block: bytes) -> object:
    try:
        return decoder.decode(block, raw=True)
    except hpack.HPACKError:
        return "error"


def _cached(decoder: HeaderDecoder, block: bytes) -> object:
    try:
        return decoder.decode(block)
    except ConnectionError_:
        return "error"


@pytest.mark.parametrize("seed", range(20))
def test_any_sequence_of_blocks_decodes_as_a_fresh_decoder_says(seed: int) -> None:
    encoder = hpack.Encoder()
    blocks = [
        encoder.encode(HEADERS),
        encoder.encode(HEADERS),
        _inserting(b"x-a", b"1"),
        _inserting(b"x-b", b"2"),
        NEWEST,
        SECOND,
        NEWEST + SECOND,
        b"\x83\x86",  # static entries only
        TABLE_EMPTIED + TABLE_RESTORED,
    ]
    chosen = random.Random(seed).choices(blocks, k=200)
    cached, reference = HeaderDecoder(), hpack.Decoder()
    for block in chosen:
        expected = _reference(reference, block)
        assert _cached(cached, block) == expected
        if expected == "error":  # a connection error: the connection and its decoder end
            cached, reference = HeaderDecoder(), hpack.Decoder()


def test_a_block_kept_is_forgotten_once_another_changes_the_table() -> None:
    decoder = HeaderDecoder()
    decoder.decode(_inserting(b"x-a", b"1"))
    static = decoder.decode(b"\x83\x86")
    assert decoder.decode(b"\x83\x86") is static
    decoder.decode(_inserting(b"x-b", b"2"))
    again = decoder.decode(b"\x83\x86")  # decoded anew: the table changed meanwhile
    assert again == static and again is not static
