"""What one client may cost the native gRPC server (docs/hardening.md): length prefixes that claim
what never comes, HTTP/2 floods (PING, SETTINGS, RST_STREAM, frames that carry nothing) and
messages whose parsing or inflating would hold the event loop.

Frames are written by hand (tests/h2client.py ``RawClient``) against a real ``shoal serve``.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib

import numpy as np
import pytest
from hyperframe.frame import PriorityFrame, SettingsFrame

from shoal.frontends.grpc._wire import MAX_WALKED_FIELDS
from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import (
    PREFACE,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RawClient,
    RstStreamFrame,
    grpc_frame,
    identity_request,
    output_array,
    request_headers,
)
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ENHANCE_YOUR_CALM = 0xB
RESOURCE_EXHAUSTED = "8"
READ_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server():
    args = (
        "--grpc-http2-stream-reset-burst",
        "50",
        "--grpc-http2-stream-reset-rate",
        "1",
        "--grpc-http2-max-empty-frames",
        "100",
        "--grpc-http2-max-queued-control-frames",
        "100",
        "--grpc-max-message-size",
        str(16 * MIB),
        "--grpc-max-connection-buffer-size",
        str(16 * MIB),
        "--grpc-read-timeout-secs",
        str(READ_TIMEOUT),
    )
    with ShoalServer(BUNDLED, extra_args=args) as srv:
        yield srv


def _rss(server: ShoalServer) -> int:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _call(raw: RawClient, stream_id: int, body: bytes) -> tuple[str | None, str | None, bytes]:
    """A unary ModelInfer on ``stream_id``: grpc-status, grpc-message and the reply message."""
    headers = request_headers(raw.port)
    raw.send(
        HeadersFrame(stream_id, data=raw.block(headers), flags=["END_HEADERS"]),
        DataFrame(stream_id, data=grpc_frame(body), flags=["END_STREAM"]),
    )
    response = raw.read_stream(stream_id)
    messages = response.messages()
    return response.status, response.message, messages[0] if messages else b""


def _served(server: ShoalServer) -> None:
    """A new connection's identity call is answered right."""
    data = np.arange(3, dtype=np.int32)
    with RawClient(server.grpc_port, timeout=30) as raw:
        status, message, reply = _call(raw, 1, identity_request(data))
    assert status == "0", message
    np.testing.assert_array_equal(output_array(reply, np.int32), data)


def _data_frames(stream_id: int, data: bytes) -> list[DataFrame]:
    """``data`` in DATA frames of the largest size the server takes (1 MiB), the last ending
    the stream."""
    size = MIB
    frames = [DataFrame(stream_id, data=data[i : i + size]) for i in range(0, len(data), size)]
    frames[-1].flags.add("END_STREAM")
    return frames


def _goaway(raw: RawClient) -> GoAwayFrame | None:
    """Frames until a GOAWAY (returned) or the end of the connection (None)."""
    while True:
        try:
            frame = raw.read_frame()
        except TimeoutError:
            return None
        if frame is None or isinstance(frame, GoAwayFrame):
            return frame


# --- length prefixes ----------------------------------------------------------------------------


def test_a_length_prefix_takes_memory_only_as_the_message_arrives(server):
    # Two streams announce 15 MiB messages (within --grpc-max-message-size) and send 10 bytes
    # each: before, each announced size was allocated (and zero-filled) at once.
    _served(server)
    before = _rss(server)
    with RawClient(server.grpc_port) as raw:
        for stream_id in (1, 3, 5, 7):
            raw.send(
                HeadersFrame(
                    stream_id, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]
                ),
                DataFrame(stream_id, data=struct.pack(">BI", 0, 15 * MIB) + b"\x0a" * 10),
            )
        raw.ping(b"received")  # the server has read all of it
        grown = _rss(server) - before
        assert grown < 16 * MIB, f"the server grew {grown / MIB:.0f} MiB for 60 bytes received"
        # The connection still serves calls beside the unfinished ones.
        status, message, _ = _call(raw, 9, identity_request(np.arange(2, dtype=np.int32)))
        assert status == "0", message
    _served(server)


def test_what_one_connection_holds_is_bounded_across_its_streams(server):
    """Three streams each send 6 MiB of a 15 MiB message: within the message limit each, but
    past what the connection may hold (16 MiB), so the third call is refused as its bytes come
    instead of the connection holding the limit times its streams."""
    _served(server)
    before = _rss(server)
    with RawClient(server.grpc_port) as raw:
        part = struct.pack(">BI", 0, 15 * MIB) + b"\x0a" * (6 * MIB - 5)
        for stream_id in (1, 3, 5):
            frames = _data_frames(stream_id, part)
            frames[-1].flags.discard("END_STREAM")  # the message is not over
            headers = raw.block(request_headers(raw.port))
            raw.send(HeadersFrame(stream_id, data=headers, flags=["END_HEADERS"]), *frames)
        refused = raw.read_stream(5)
        assert refused.status == RESOURCE_EXHAUSTED, refused.message
        assert "--grpc-max-connection-buffer-size" in (refused.message or "")
        grown = _rss(server) - before
        assert grown < 28 * MIB, f"the server grew {grown / MIB:.0f} MiB"
        # The calls within the budget go on; the connection serves new calls.
        status, message, _ = _call(raw, 7, identity_request(np.arange(2, dtype=np.int32)))
        assert status == "0", message
    _served(server)


def test_a_message_over_the_limit_is_refused_from_its_prefix(server):
    with RawClient(server.grpc_port) as raw:
        raw.send(
            HeadersFrame(1, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]),
            DataFrame(1, data=struct.pack(">BI", 0, 2**31 - 1)),
        )
        response = raw.read_stream(1)
    assert response.status == RESOURCE_EXHAUSTED
    assert "2147483647 vs. 16777216" in (response.message or "")


# --- HTTP/2 floods ------------------------------------------------------------------------------


def test_a_ping_flood_ends_with_goaway_enhance_your_calm(server):
    # grpc-core's policy under Triton's defaults: without calls, a second PING within two hours
    # is a strike, and the third strike ends the connection.
    with RawClient(server.grpc_port, timeout=10) as raw:
        raw.send(*(PingFrame(0, opaque_data=b"%08d" % i) for i in range(10)))
        goaway = _goaway(raw)
    assert goaway is not None, "no GOAWAY after ten PINGs"
    assert goaway.error_code == ENHANCE_YOUR_CALM
    assert goaway.additional_data == b"too_many_pings"
    _served(server)


def test_pings_between_answers_are_not_strikes(server):
    # grpc-core forgives a client's pings once the server has sent data since (BDP pings of a
    # busy client): a ping after each answer never ends the connection.
    data = np.arange(2, dtype=np.int32)
    with RawClient(server.grpc_port, timeout=10) as raw:
        for index in range(6):
            status, message, _ = _call(raw, 1 + 2 * index, identity_request(data))
            assert status == "0", message
            seen = raw.ping(b"%08d" % index)
            assert not [f for f in seen if isinstance(f, GoAwayFrame)], seen


def test_a_settings_flood_from_a_client_that_never_reads_is_cut_off(server):
    # Every SETTINGS asks for an ACK. A client that never reads makes them pile up in the
    # server's write buffer: past --grpc-http2-max-queued-control-frames (100 here) queued while
    # writing is paused, the server drops the connection and what it had queued.
    _served(server)
    before = _rss(server)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.grpc_port))
    batch = SettingsFrame(0).serialize() * 10_000
    sent = 0
    cut = False
    try:
        sock.sendall(PREFACE)
        while sent < 64 * MIB:
            try:
                sock.sendall(batch)
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sent += len(batch)
        grown = _rss(server) - before
    finally:
        sock.close()
    assert cut, f"the server took {sent / MIB:.0f} MiB of SETTINGS from a client that never reads"
    assert grown < 16 * MIB, f"the server grew {grown / MIB:.0f} MiB"
    _served(server)


def test_streams_reset_faster_than_the_rate_end_the_connection(server):
    # Rapid reset (CVE-2023-44487): open a call and reset it at once, over and over. The burst
    # is 50 streams here, then 1 a second.
    with RawClient(server.grpc_port, timeout=10) as raw:
        frames = []
        for index in range(100):
            stream_id = 1 + 2 * index
            frames += [
                HeadersFrame(
                    stream_id, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]
                ),
                RstStreamFrame(stream_id, error_code=0x8),
            ]
        try:
            raw.send(*frames)
        except (BrokenPipeError, ConnectionResetError):
            pass
        goaway = _goaway(raw)
    assert goaway is not None and goaway.error_code == ENHANCE_YOUR_CALM, goaway
    assert goaway.additional_data == b"too many streams reset"
    _served(server)


def test_a_few_resets_are_fine(server):
    data = np.arange(2, dtype=np.int32)
    with RawClient(server.grpc_port, timeout=10) as raw:
        for index in range(10):
            stream_id = 1 + 4 * index
            raw.send(
                HeadersFrame(
                    stream_id, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]
                ),
                RstStreamFrame(stream_id, error_code=0x8),
            )
            status, message, _ = _call(raw, stream_id + 2, identity_request(data))
            assert status == "0", message


@pytest.mark.parametrize("kind", ["empty DATA", "PRIORITY", "unknown"])
def test_frames_that_carry_nothing_end_the_connection(server, kind):
    with RawClient(server.grpc_port, timeout=10) as raw:
        raw.send(HeadersFrame(1, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]))
        if kind == "empty DATA":
            flood = DataFrame(1).serialize() * 200
        elif kind == "PRIORITY":
            flood = PriorityFrame(1, depends_on=0, stream_weight=16).serialize() * 200
        else:
            flood = b"\x00\x00\x00\xfa\x00\x00\x00\x00\x00" * 200  # type 0xFA, empty
        try:
            raw.sock.sendall(flood)
        except (BrokenPipeError, ConnectionResetError):
            pass
        goaway = _goaway(raw)
    assert goaway is not None and goaway.error_code == ENHANCE_YOUR_CALM, goaway
    assert goaway.additional_data == b"too many frames that carry nothing"


# --- parsing and inflating ----------------------------------------------------------------------


def _raw_call(server: ShoalServer, body: bytes, compressed: bool = False) -> str:
    """``body`` as one call's message; its answer as "status message"."""
    with RawClient(server.grpc_port, timeout=60) as raw:
        extra = (("grpc-encoding", "gzip"),) if compressed else ()
        headers = request_headers(raw.port, extra=extra)
        raw.send(
            HeadersFrame(1, data=raw.block(headers), flags=["END_HEADERS"]),
            *_data_frames(1, grpc_frame(body, compressed)),
        )
        response = raw.read_stream(1)
        return f"{response.status} {response.message}"


def test_a_message_of_zero_bytes_is_refused_without_walking_it(server):
    # 8 MiB of zero bytes: a field numbered 0 at once. Before, shoal's wire splitter walked it
    # byte by byte in Python (seconds per MiB, every other client waiting).
    # How fast is the unit tests' (test_protos: a field numbered 0 is refused at once).
    outcome = _raw_call(server, bytes(8 * MIB))
    assert outcome.startswith("3 "), outcome
    _served(server)


def test_a_message_of_millions_of_fields_is_parsed_at_c_speed(server):
    # Eight million empty model_name fields (16 MiB): past the walk's field budget, protobuf's
    # C parser takes the message whole. Before: eight million rounds of a Python loop.
    # That the walk stops at its budget is the unit tests' (test_protos, test_native_split).
    outcome = _raw_call(server, b"\x0a\x00" * (8 * MIB))
    assert not outcome.startswith("0 "), outcome
    _served(server)


def test_a_gzip_bomb_is_refused_at_the_message_size_limit(server):
    # 32 MiB of zeros compress to 32 KiB; the limit (16 MiB here) is checked while inflating.
    bomb = zlib.compress(bytes(32 * MIB), wbits=16 + zlib.MAX_WBITS)
    outcome = _raw_call(server, bomb, compressed=True)
    assert outcome.startswith(RESOURCE_EXHAUSTED + " "), outcome
    assert "more than 16777216 bytes uncompressed" in outcome
    _served(server)


def test_a_compressed_request_within_the_limit_is_served(server):
    data = np.arange(300_000, dtype=np.int32)  # inflated off the event loop
    message = zlib.compress(identity_request(data), wbits=16 + zlib.MAX_WBITS)
    with RawClient(server.grpc_port, timeout=60) as raw:
        headers = request_headers(raw.port, extra=(("grpc-encoding", "gzip"),))
        raw.send(
            HeadersFrame(1, data=raw.block(headers), flags=["END_HEADERS"]),
            DataFrame(1, data=grpc_frame(message, True), flags=["END_STREAM"]),
        )
        response = raw.read_stream(1)
    assert response.status == "0", response.message
    np.testing.assert_array_equal(output_array(response.messages()[0], np.int32), data)


def test_a_request_too_long_to_walk_is_still_served_right(server):
    # Over the walk's field budget (a parameter is a field each): protobuf parses the raw
    # contents with the rest, and the answer is the same.
    data = np.arange(5, dtype=np.int32)
    request = pb.ModelInferRequest.FromString(identity_request(data))
    for index in range(MAX_WALKED_FIELDS + 10):
        request.parameters[f"p{index}"].int64_param = index
    with RawClient(server.grpc_port, timeout=30) as raw:
        status, message, reply = _call(raw, 1, request.SerializeToString())
    assert status == "0", message
    np.testing.assert_array_equal(output_array(reply, np.int32), data)


# --- half-sent connections ------------------------------------------------------------------------


def _dropped_after(sock: socket.socket) -> float:
    """Seconds until the server drops the connection (reading whatever it sends first)."""
    started = time.monotonic()
    sock.settimeout(READ_TIMEOUT + 10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.parametrize("half", ["preface", "frame", "message"])
def test_a_half_sent_connection_is_dropped_after_the_read_timeout(server, half):
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as sock:
        if half == "preface":
            sock.sendall(PREFACE[:10])
        else:
            sock.sendall(PREFACE + SettingsFrame(0).serialize())
            if half == "frame":
                sock.sendall(b"\x00\x00\x64\x00\x00\x00\x00\x00\x01" + b"x" * 10)
            else:
                with RawClient(server.grpc_port) as encoder:  # only for its HPACK encoder
                    block = encoder.block(request_headers(server.grpc_port))
                sock.sendall(
                    HeadersFrame(1, data=block, flags=["END_HEADERS"]).serialize()
                    + DataFrame(1, data=struct.pack(">BI", 0, 100) + b"x" * 10).serialize()
                )
        waited = _dropped_after(sock)
    assert READ_TIMEOUT * 0.9 <= waited < READ_TIMEOUT + 8, f"{waited:.1f} s"
    _served(server)


def test_an_idle_connection_is_kept(server):
    # Nothing half-sent: gRPC clients keep their channels open between calls.
    data = np.arange(2, dtype=np.int32)
    with RawClient(server.grpc_port, timeout=10) as raw:
        deadline = time.monotonic() + READ_TIMEOUT * 2 + 1
        while time.monotonic() < deadline:
            raw.sock.settimeout(0.5)
            try:
                assert raw.sock.recv(1, socket.MSG_PEEK) != b"", "the server closed it"
            except TimeoutError:
                pass
        raw.sock.settimeout(10)
        status, message, _ = _call(raw, 1, identity_request(data))
    assert status == "0", message
