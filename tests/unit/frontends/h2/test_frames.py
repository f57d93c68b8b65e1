"""shoal's HTTP/2 frame and HPACK builders, checked against RFC 7541's examples and decoded with
independent implementations (``hpack``, ``hyperframe``); and the gRPC layer's small codecs."""

from __future__ import annotations

import hpack
import pytest
from hpack.hpack import decode_integer
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from shoal.frontends.grpc.native_headers import (
    MESSAGE_LIMIT,
    message_value,
    percent_encode,
    status_block,
    timeout_seconds,
)
from shoal.frontends.h2 import frames as h2

pytestmark = pytest.mark.timeout(30)


def _parse(data: bytes) -> Frame:
    frame, length = Frame.parse_frame_header(memoryview(data[:9]))
    assert len(data) == 9 + length
    frame.parse_body(memoryview(data[9:]))
    return frame


def _decode(block: bytes) -> tuple[list[tuple[str, str]], hpack.Decoder]:
    decoder = hpack.Decoder()
    return [(str(name), str(value)) for name, value in decoder.decode(block)], decoder


# --- HPACK integers (RFC 7541 section 5.1, appendix C.1) ----------------------------------------


def test_rfc7541_c1_1_ten_with_a_5_bit_prefix() -> None:
    assert h2.hpack_integer(10, 5) == b"\x0a"


def test_rfc7541_c1_2_1337_with_a_5_bit_prefix() -> None:
    assert h2.hpack_integer(1337, 5) == b"\x1f\x9a\x0a"


def test_rfc7541_c1_3_42_at_an_octet_boundary() -> None:
    assert h2.hpack_integer(42, 8) == b"\x2a"


def test_flag_bits_stay_in_the_first_byte() -> None:
    assert h2.hpack_integer(10, 5, first=0xE0) == b"\xea"
    assert h2.hpack_integer(1337, 5, first=0xE0) == b"\xff\x9a\x0a"


@pytest.mark.parametrize("prefix", [4, 5, 6, 7, 8])
@pytest.mark.parametrize(
    "value",
    [0, 1, 14, 15, 16, 30, 31, 62, 63, 126, 127, 128, 254, 255, 256, 1337, 2**14, 2**31 - 1],
)
def test_integers_decode_with_hpack(prefix: int, value: int) -> None:
    encoded = h2.hpack_integer(value, prefix)
    assert decode_integer(encoded, prefix) == (value, len(encoded))
    limit = (1 << prefix) - 1
    assert (len(encoded) == 1) == (value < limit)  # the prefix alone below its maximum


# --- header blocks ------------------------------------------------------------------------------


def test_grpc_response_headers_decode() -> None:
    headers, decoder = _decode(h2.GRPC_RESPONSE_HEADERS)
    assert headers == [(":status", "200"), ("content-type", "application/grpc")]
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing indexed: stateless


@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 300, 60_000])
def test_literal_decodes(size: int) -> None:
    value = bytes(ord("a") + i % 26 for i in range(size))
    headers, decoder = _decode(h2.literal(b"grpc-message", value))
    assert headers == [("grpc-message", value.decode())]
    assert len(decoder.header_table.dynamic_entries) == 0


def test_literal_is_never_indexed_by_the_peer() -> None:
    """Two blocks through one decoder: the second is not affected by the first."""
    decoder = hpack.Decoder()
    block = h2.literal(b"grpc-status", b"0") + h2.literal(b"x-a", b"b")
    for _ in range(2):
        assert decoder.decode(block, raw=True) == [(b"grpc-status", b"0"), (b"x-a", b"b")]
    assert len(decoder.header_table.dynamic_entries) == 0


@pytest.mark.parametrize("status", [200, 404, 405, 415, 503])
def test_status_headers_decode(status: int) -> None:
    headers, _ = _decode(h2.status_headers(status))
    assert headers == [(":status", str(status))]


def test_literal_indexed_name_uses_the_static_table() -> None:
    # Entry 31 is content-type, entry 16 accept-encoding (RFC 7541 appendix A).
    headers, _ = _decode(h2.literal_indexed_name(31, b"text/plain"))
    assert headers == [("content-type", "text/plain")]
    headers, _ = _decode(h2.literal_indexed_name(16, b"gzip"))
    assert headers == [("accept-encoding", "gzip")]


def test_trailers_only_error_block_decodes() -> None:
    block = h2.GRPC_RESPONSE_HEADERS + status_block(12, "Method not found!")
    headers, _ = _decode(block)
    assert headers == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "12"),
        ("grpc-message", "Method not found!"),
    ]
    assert _decode(status_block(0, ""))[0] == [("grpc-status", "0")]


def test_message_at_the_limit_is_whole() -> None:
    text = "e" * MESSAGE_LIMIT
    assert message_value(text) == text.encode()


@pytest.mark.parametrize("unit", ["m", "ü", "日", "🙂", "%"])
def test_long_message_is_cut_to_the_limit_and_says_so(unit: str) -> None:
    text = "Request for unknown model: '" + unit * 100_000 + "' is not found"
    value = message_value(text)
    assert len(value) <= MESSAGE_LIMIT
    decoded = _percent_decode(value)
    kept, note = decoded.split("... (")
    assert text.startswith(kept)
    cut = len(text) - len(kept)
    assert note == f"{cut} more characters cut: a gRPC status message is limited to 4 KiB)"
    assert len(value) > MESSAGE_LIMIT - 16  # cut near the limit, not far below it


def _percent_decode(value: bytes) -> str:
    out = bytearray()
    at = 0
    while at < len(value):
        if value[at] == 0x25:
            out.append(int(value[at + 1 : at + 3], 16))
            at += 3
        else:
            out.append(value[at])
            at += 1
    return out.decode("utf-8")


# --- frames -------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [0, 1, 255, 256, 16_384, 65_535, 65_536, 2**24 - 1])
@pytest.mark.parametrize("stream_id", [1, 255, 256, 65_537, 2**31 - 1])
def test_frame_header_round_trip(length: int, stream_id: int) -> None:
    header = h2.frame_header(h2.DATA, h2.END_STREAM | h2.PADDED, stream_id, length)
    assert len(header) == h2.FRAME_HEADER_SIZE == 9
    frame, parsed_length = Frame.parse_frame_header(memoryview(header))
    assert isinstance(frame, DataFrame)
    assert parsed_length == length
    assert frame.stream_id == stream_id
    assert set(frame.flags) == {"END_STREAM", "PADDED"}
    high, low, kind, flags, sid = h2.FRAME_HEADER.unpack(header)
    assert ((high << 8) | low, kind, flags, sid) == (length, h2.DATA, 0x9, stream_id)
    # read_header, at an offset, with the reserved bit set (a receiver ignores it)
    wire = b"xyz" + header[:5] + bytes((header[5] | 0x80,)) + header[6:]
    assert h2.read_header(memoryview(wire), 3) == (length, h2.DATA, 0x9, stream_id)
    assert h2.read_header(bytearray(wire), 3) == (length, h2.DATA, 0x9, stream_id)


def test_headers_frame() -> None:
    data = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 3, h2.GRPC_RESPONSE_HEADERS)
    frame = _parse(data)
    assert isinstance(frame, HeadersFrame)
    assert frame.stream_id == 3 and set(frame.flags) == {"END_HEADERS", "END_STREAM"}
    assert frame.data == h2.GRPC_RESPONSE_HEADERS


def test_settings_frame_and_parse_settings() -> None:
    settings = {h2.SETTINGS_INITIAL_WINDOW_SIZE: h2.MAX_WINDOW, h2.SETTINGS_MAX_FRAME_SIZE: 1 << 20}
    data = h2.settings_frame(settings)
    frame = _parse(data)
    assert isinstance(frame, SettingsFrame)
    assert frame.settings == settings
    assert h2.parse_settings(data[9:]) == list(settings.items())
    ack = _parse(h2.frame(h2.SETTINGS, h2.ACK, 0))
    assert isinstance(ack, SettingsFrame) and "ACK" in ack.flags


def test_control_frames() -> None:
    update = _parse(h2.window_update(5, 12345))
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (5, 12345)
    reset = _parse(h2.rst_stream(7, h2.REFUSED_STREAM))
    assert isinstance(reset, RstStreamFrame)
    assert (reset.stream_id, reset.error_code) == (7, 7)
    goaway = _parse(h2.goaway(9, h2.PROTOCOL_ERROR, b"bad preface"))
    assert isinstance(goaway, GoAwayFrame)
    assert (goaway.last_stream_id, goaway.error_code) == (9, 1)
    assert goaway.additional_data == b"bad preface"
    ping = _parse(h2.frame(h2.PING, h2.ACK, 0, b"12345678"))
    assert isinstance(ping, PingFrame) and ping.opaque_data == b"12345678"


def test_read_u32_drops_the_reserved_bit() -> None:
    assert h2.read_u32(b"\x80\x00\x00\x05") == 5
    assert h2.read_u32(b"\x7f\xff\xff\xff") == 2**31 - 1
    assert h2.read_u32(memoryview(b"\x00\x00\x01\x00")) == 256


# --- gRPC's codecs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("", b""),
        ("Method not found!", b"Method not found!"),
        ("100% sure", b"100%25 sure"),
        ("line\nbreak\ttab", b"line%0Abreak%09tab"),
        ("ü", b"%C3%BC"),
        ("a\x7fb", b"a%7Fb"),
        ("~ and space", b"~ and space"),
        ("日本", b"%E6%97%A5%E6%9C%AC"),
    ],
)
def test_percent_encode(text: str, encoded: bytes) -> None:
    assert percent_encode(text) == encoded


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"200m", 0.2),
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"5S", 5.0),
        (b"250u", 250e-6),
        (b"7n", 7e-9),
        (b"0m", 0.0),
        (b"99999999S", 99_999_999.0),
    ],
)
def test_timeout_seconds(value: bytes, seconds: float) -> None:
    assert timeout_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", [b"", b"10", b"S", b"123456789S", b"1x", b"-1S", b"1.5S", b" 1S", b"1S ", b"1s"]
)
def test_timeout_seconds_rejects(value: bytes) -> None:
    assert timeout_seconds(value) is None


def test_table_size_zero_is_a_dynamic_table_size_update() -> None:
    decoder = hpack.Decoder()
    assert decoder.header_table.maxsize == 4096
    headers = decoder.decode(h2.TABLE_SIZE_ZERO + h2.GRPC_RESPONSE_HEADERS)
    assert headers == [(":status", "200"), ("content-type", "application/grpc")]
    assert decoder.header_table.maxsize == 0
    assert h2.TABLE_SIZE_ZERO == b"\x20"


def test_the_frame_header_size_written_out_is_the_structs():
    assert h2.FRAME_HEADER.size == h2.FRAME_HEADER_SIZE


@pytest.mark.parametrize(("unit", "count"), [("😀", 1_360), ("€", 1_365), ("😀", 342)])
def test_a_short_message_of_wide_characters_is_cut_too(unit: str, count: int) -> None:
    """Under a third of the limit in characters, over it once encoded (up to 12 bytes each)."""
    value = message_value(unit * count)
    assert len(value) <= MESSAGE_LIMIT
    assert _percent_decode(value).startswith(unit * 100)
    assert value.endswith(b"limited to 4 KiB)")
