"""Property tests of the HTTP/2 connection: whatever a client sends, the connection answers or
closes; no exception escapes ``data_received`` (an escaped one would kill the transport without a
GOAWAY and leave its calls running)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers, Http2Connection

pytestmark = pytest.mark.timeout(120)


class _Transport:
    """Collects what the connection writes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def writelines(self, parts: list[Any]) -> None:
        self.written.extend(bytes(p) for p in parts)

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class _Echo:
    """A stream handler that answers every request with its own data once it ends."""

    def __init__(self, connection: Http2Connection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.data = bytearray()

    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        for piece in pieces:
            self.data += piece
        if end_stream:
            self.trailers_received()

    def trailers_received(self) -> None:
        self.connection.send_headers(self.stream_id, h2.GRPC_RESPONSE_HEADERS)
        self.connection.send_data(self.stream_id, bytes(self.data))
        self.connection.send_headers(self.stream_id, h2.literal(b"grpc-status", b"0"), True)

    def reset(self) -> None:
        pass

    def mid_message(self) -> bool:
        return False


def _open(connection: Http2Connection, stream_id: int, headers: Headers, end: bool) -> _Echo:
    handler = _Echo(connection, stream_id)
    if end:
        handler.trailers_received()
    return handler


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream_id)
        + payload
    )


_HEADERS = hpack.Encoder().encode(
    [
        (":method", "POST"),
        (":path", "/x"),
        (":scheme", "http"),
        ("content-type", "application/grpc"),
    ]
)

frames = st.one_of(
    # Well-formed-looking frames of every type, with random flags, streams and payloads.
    st.builds(
        _frame,
        st.integers(0, 10),
        st.integers(0, 255),
        st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]),
        st.one_of(st.binary(max_size=10), st.just(_HEADERS), st.binary(max_size=64)),
    ),
    # A valid request, so that streams exist for the other frames to hit.
    st.builds(
        lambda sid, body: (
            _frame(h2.HEADERS, h2.END_HEADERS, sid, _HEADERS)
            + _frame(h2.DATA, h2.END_STREAM, sid, body)
        ),
        st.sampled_from([1, 3, 5, 7, 9]),
        st.binary(max_size=32),
    ),
    # Raw garbage.
    st.binary(max_size=32),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, max_size=5), st.integers(1, 64))
def test_no_input_escapes_the_connection(chunks: list[bytes], split: int) -> None:
    async def scenario() -> None:
        closed: list[Http2Connection] = []
        connection = Http2Connection(_open, closed.append)
        transport = _Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        data = h2.PREFACE + h2.settings_frame({}) + b"".join(chunks)
        # Delivered in pieces, as TCP may cut it anywhere.
        for offset in range(0, len(data), split):
            if transport.closed:
                break
            connection.data_received(data[offset : offset + split])
        await asyncio.sleep(0)  # the end-of-iteration flush
        connection.connection_lost(None)
        assert closed == [connection]
        written = b"".join(transport.written)
        # The server's SETTINGS always leads what it writes.
        assert written[3] == h2.SETTINGS

    asyncio.run(scenario())
