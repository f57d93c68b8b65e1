"""Content-Encoding / Accept-Encoding handling of the HTTP codec."""

from __future__ import annotations

import gzip
import zlib

import pytest

from shoal.core import InvalidArgument
from shoal.frontends.http.codec import (
    UnsupportedEncoding,
    compress,
    decompress,
    request_encoding,
    response_encoding,
)

pytestmark = pytest.mark.timeout(30)

PAYLOAD = b'{"inputs": []}' * 100


class TestRequestEncoding:
    @pytest.mark.parametrize(
        ("header", "expected"),
        [(None, None), ("", None), ("identity", None), ("gzip", "gzip"), (" Deflate ", "deflate")],
    )
    def test_known(self, header: str | None, expected: str | None) -> None:
        assert request_encoding(header) == expected

    def test_unknown_is_unsupported(self) -> None:
        with pytest.raises(UnsupportedEncoding) as info:
            request_encoding("br")
        assert info.value.message == (
            "Unsupported compression type 'br': supported are gzip, deflate"
        )


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


class TestDecompress:
    @pytest.mark.parametrize(
        ("encoding", "body"),
        [
            # mtime=0: the same bytes on every collection (pytest-xdist workers compare ids)
            ("gzip", gzip.compress(PAYLOAD, mtime=0)),
            ("deflate", zlib.compress(PAYLOAD)),  # a zlib stream, as tritonclient sends it
            ("deflate", raw_deflate(PAYLOAD)),  # what some other clients send
        ],
        ids=["gzip", "zlib-deflate", "raw-deflate"],
    )
    def test_round_trip(self, encoding: str, body: bytes) -> None:
        assert decompress(body, encoding, limit=len(PAYLOAD)) == PAYLOAD

    def test_corrupt(self) -> None:
        with pytest.raises(InvalidArgument) as info:
            decompress(b"not gzip at all", "gzip", limit=1000)
        assert info.value.message.startswith("failed to decompress the gzip request body")

    def test_truncated(self) -> None:
        body = gzip.compress(PAYLOAD)[:-12]
        with pytest.raises(InvalidArgument) as info:
            decompress(body, "gzip", limit=10_000)
        assert info.value.message.endswith("it is truncated")

    def test_trailing_bytes(self) -> None:
        with pytest.raises(InvalidArgument) as info:
            decompress(zlib.compress(PAYLOAD) + b"junk", "deflate", limit=10_000)
        assert info.value.message.endswith("4 bytes follow the compressed data")

    def test_inflating_past_the_limit_stops_early(self) -> None:
        bomb = gzip.compress(b"\x00" * 10_000_000)
        with pytest.raises(InvalidArgument) as info:
            decompress(bomb, "gzip", limit=1000)
        assert info.value.message == (
            "Decompressed request size exceeds the maximum allowed value of 1000 bytes. "
            "Use --http-max-input-size to increase the limit."
        )

    def test_exactly_at_the_limit(self) -> None:
        assert decompress(gzip.compress(PAYLOAD), "gzip", limit=len(PAYLOAD)) == PAYLOAD


class TestResponseEncoding:
    @pytest.mark.parametrize(
        ("header", "expected"),
        [
            (None, None),
            ("", None),
            ("gzip", "gzip"),
            ("deflate", "deflate"),
            ("identity", None),
            ("br", None),
            ("gzip, deflate", "gzip"),
            ("deflate, gzip", "deflate"),
            ("gzip;q=0.5, deflate", "deflate"),
            ("gzip;q=0, identity;q=0", None),
            ("identity, gzip", None),
            ("identity;q=0.1, gzip;q=0.2", "gzip"),
            ("gzip;q=abc, deflate;q=0.1", "deflate"),
            ("*", None),
        ],
    )
    def test_negotiation(self, header: str | None, expected: str | None) -> None:
        assert response_encoding(header) == expected

    def test_compress_gzip(self) -> None:
        assert gzip.decompress(compress(PAYLOAD, "gzip")) == PAYLOAD

    def test_compress_deflate_is_a_zlib_stream(self) -> None:
        assert zlib.decompress(compress(PAYLOAD, "deflate")) == PAYLOAD
