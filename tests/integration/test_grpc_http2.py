"""The native gRPC server's HTTP/2 and gRPC layers, frame by frame, against a real ``shoal serve``.

Most cases use the ``h2`` library as the client (tests/h2client.py), which checks every frame the
server sends (frame sizes, flow-control windows, header blocks) and raises on a violation; the
others write frames by hand for what h2 will not send (CONTINUATION, padding, garbage, frames
after GOAWAY).
"""

from __future__ import annotations

import signal
import socket
import struct
import time
import zlib

import numpy as np
import pytest
from h2.settings import SettingCodes
from hyperframe.frame import PriorityFrame

from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import (
    NO_ERROR,
    REFUSED_STREAM,
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    H2Client,
    HeadersFrame,
    RawClient,
    float_request,
    grpc_frame,
    gzip_frame,
    identity_request,
    int_request,
    output_array,
    request_headers,
)
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer
from tests.integration.test_metrics import _scrape, _value, _values

pytestmark = pytest.mark.timeout(60)

MODELS = ("identity", "slow", "cancel_waiter", "decoupled_repeat")
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"


def _args(*models: str) -> tuple[str, ...]:
    args = ["--model-control-mode", "explicit"]
    for model in models:
        args += ["--load-model", model]
    return tuple(args)


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=_args(*MODELS), metrics=True) as srv:
        yield srv


@pytest.fixture
def client(server):
    with H2Client(server.grpc_port) as c:
        yield c


def _wait_for_log(server: ShoalServer, line: str, after: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in server.output[after:]:
        assert time.monotonic() < deadline, f"{line!r} not in the log:\n{server.output[after:]}"
        time.sleep(0.02)  # polling the server's log


def _assert_identity(response, data: np.ndarray) -> None:
    assert response.headers[":status"] == "200"
    assert response.headers["content-type"] == "application/grpc"
    assert response.status == "0", (response.status, response.message)
    (message,) = response.messages()
    np.testing.assert_array_equal(output_array(message, data.dtype), data)


# --- calls --------------------------------------------------------------------------------------


def test_unary_call(client):
    data = np.arange(10, dtype=np.int32) * 7
    response = client.call(grpc_frame(identity_request(data)))
    _assert_identity(response, data)
    assert response.trailers == {"grpc-status": "0"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("window", [1000, 1 << 21], ids=["window-1000", "window-2MiB"])
def test_flow_control_large_response(server, window):
    """A ~1 MiB response to a client with a small (or a large) stream window and the default
    16 KiB frame size: h2 raises if a frame is larger or a window is exceeded, and the client
    gives window back only once it has read the data."""
    data = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
    with H2Client(server.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: window}) as client:
        assert client.conn.max_inbound_frame_size == 16_384
        assert client.conn.local_settings.initial_window_size == window
        response = client.call(grpc_frame(identity_request(data)))
        _assert_identity(response, data)
        assert sum(response.data_frames) == len(response.data) > 1 << 20
        assert max(response.data_frames) <= min(window, 16_384)
        if window > 16_384:
            assert max(response.data_frames) == 16_384  # full frames while the window allows
        # The connection is still in order: a second call on it.
        _assert_identity(client.call(grpc_frame(identity_request(data[:5]))), data[:5])


@pytest.mark.timeout(30)
def test_streams_share_the_connection_window(server):
    """Four 1 MiB responses at once, each stream's window large enough, the connection's the
    default 64 KiB: the server shares it out as the client gives it back."""
    rng = np.random.default_rng(1)
    with H2Client(server.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: 1 << 21}) as client:
        assert client.conn.inbound_flow_control_window == 65_535
        streams = {}
        for _ in range(4):
            data = rng.integers(0, 255, 1 << 20, dtype=np.uint8)
            streams[client.start(grpc_frame(identity_request(data)))] = data
        for stream_id, data in streams.items():
            _assert_identity(client.wait(stream_id), data)


@pytest.mark.timeout(30)
def test_a_larger_initial_window_resumes_a_blocked_stream(server):
    """The client never sends a stream WINDOW_UPDATE: once the server has used the 1000-byte
    window it waits, and a SETTINGS_INITIAL_WINDOW_SIZE raise lets the rest through."""
    data = np.random.default_rng(2).integers(0, 255, 1 << 19, dtype=np.uint8)
    with H2Client(server.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: 1000}) as client:
        client.ack = False
        client.conn.increment_flow_control_window(1 << 30)  # the connection is not the limit
        stream_id = client.start(grpc_frame(identity_request(data)))
        response = client.responses[stream_id]
        while len(response.data) < 1000:
            client.pump()
        assert len(response.data) == 1000 and not response.done  # exactly the window
        client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1 << 21})
        client.flush()
        _assert_identity(client.wait(stream_id), data)


@pytest.mark.timeout(30)
def test_stream_infer_with_a_small_window(server):
    """ModelStreamInfer with two requests to a decoupled model, read through a 1000-byte window:
    every response arrives, in order per request, then grpc-status 0."""
    requests = b""
    for request_id, count in (("many", 300), ("two", 2)):
        message = pb.ModelInferRequest.FromString(int_request("decoupled_repeat", "COUNT", count))
        message.id = request_id
        requests += grpc_frame(message.SerializeToString())
    with H2Client(server.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: 1000}) as client:
        response = client.call(requests, path=STREAM_PATH)
        assert response.status == "0", response.message
        assert max(response.data_frames) <= 1000
        indexes: dict[str, list[int]] = {"many": [], "two": []}
        for message in response.messages():
            reply = pb.ModelStreamInferResponse.FromString(message)
            assert not reply.error_message
            if reply.infer_response.outputs:  # the final flag alone is an empty response
                index = output_array(reply.infer_response.SerializeToString(), np.int32)
                indexes[reply.infer_response.id].append(int(index[0]))
        assert indexes == {"many": list(range(300)), "two": [0, 1]}


def test_continuation_and_padding(server):
    """A header block split over HEADERS and two CONTINUATION frames, padded HEADERS, and the
    message split over padded DATA frames."""
    data = np.arange(100, dtype=np.int32)
    body = grpc_frame(identity_request(data))
    with RawClient(server.grpc_port) as raw:
        headers = request_headers(server.grpc_port, extra=(("x-custom", "a" * 300),))
        block = raw.block(headers)
        third = len(block) // 3
        first = HeadersFrame(1, data=block[:third], flags=["PADDED", "PRIORITY"])
        first.pad_length = 17
        first.depends_on, first.stream_weight = 0, 200
        # A frame of an unknown type (0xFA) and PRIORITY are ignored (RFC 9113 4.1, 5.3.2).
        raw.sock.sendall(struct.pack(">HBBBI", 0, 8, 0xFA, 0x3, 0) + b"whatever")
        raw.send(
            PriorityFrame(1, depends_on=0, stream_weight=15),
            first,
            ContinuationFrame(1, data=block[third : 2 * third]),
            ContinuationFrame(1, data=block[2 * third :], flags=["END_HEADERS"]),
        )
        half = len(body) // 2
        one = DataFrame(1, data=body[:3], flags=["PADDED"])  # inside the 5-byte prefix
        one.pad_length = 0
        two = DataFrame(1, data=body[3:half], flags=["PADDED"])
        two.pad_length = 255
        three = DataFrame(1, data=body[half:], flags=["PADDED", "END_STREAM"])
        three.pad_length = 1
        raw.send(one, two, three)
        response = raw.read_stream(1)
        _assert_identity(response, data)


def test_a_smaller_header_table_is_acknowledged_in_the_next_block(server):
    """The client shrinks SETTINGS_HEADER_TABLE_SIZE to 0: the server's next header block starts
    with a dynamic table size update (RFC 7541 section 4.2), and only that one."""
    data = np.arange(3, dtype=np.int32)
    port = server.grpc_port
    with RawClient(port, settings={SettingCodes.HEADER_TABLE_SIZE: 0}) as raw:
        blocks = []
        for stream_id in (1, 3):
            raw.send(
                HeadersFrame(
                    stream_id, data=raw.block(request_headers(port)), flags=["END_HEADERS"]
                ),
                DataFrame(stream_id, data=grpc_frame(identity_request(data)), flags=["END_STREAM"]),
            )
            response = raw.read_stream(stream_id)
            _assert_identity(response, data)
            blocks += response.blocks
        assert [block[:1] for block in blocks] == [b"\x20", b"\x00", b"\x88", b"\x00"]
        assert blocks[0][1:] == blocks[2]  # otherwise the same headers


@pytest.mark.timeout(30)
def test_many_concurrent_streams(client):
    streams = {}
    for index in range(50):
        data = np.arange(index, index + 1 + index * 10, dtype=np.int32)
        streams[client.start(grpc_frame(identity_request(data)))] = data
    assert len(set(streams)) == 50
    for stream_id, data in streams.items():
        _assert_identity(client.wait(stream_id), data)


def test_ping_is_acknowledged_with_its_payload(client):
    client.ping(b"shoal-h2")
    client.ping(b"\x00\xff" * 4)
    assert client.pings == [b"shoal-h2", b"\x00\xff" * 4]


# --- errors -------------------------------------------------------------------------------------


def test_unknown_method_is_unimplemented(client):
    response = client.call(grpc_frame(b""), path="/inference.GRPCInferenceService/Nope")
    assert response.headers[":status"] == "200"
    assert response.status == "12"
    assert response.message == "Method not found!"
    assert not response.data
    response = client.call(grpc_frame(b""), path="/other.Service/ModelInfer")
    assert response.status == "12"


def test_not_post_is_405(client):
    response = client.call(None, method="GET")
    assert response.headers[":status"] == "405"
    assert "grpc-status" not in response.headers


def test_wrong_content_type_is_415(client):
    response = client.call(grpc_frame(b""), content_type="application/json")
    assert response.headers[":status"] == "415"
    # The connection still serves gRPC.
    data = np.arange(3, dtype=np.int32)
    _assert_identity(client.call(grpc_frame(identity_request(data))), data)


_MESSAGE = identity_request(np.arange(3, dtype=np.int32))


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (None, "12", "no request message for a unary method"),
        (grpc_frame(_MESSAGE) * 2, "12", "more than one request message for a unary method"),
        (grpc_frame(_MESSAGE)[:-1], "13", "the request stream ended inside a message"),
        (grpc_frame(_MESSAGE)[:3], "13", "the request stream ended inside a message"),
        (grpc_frame(b"\xff\xff\xff"), "3", "failed to parse the request message: "),
    ],
    ids=["none", "two", "truncated", "cut-prefix", "not-protobuf"],
)
def test_malformed_unary_requests_end_with_a_status(client, body, status, message):
    """Each ends at once with a status (no hang), and the connection serves on."""
    response = client.call(body)
    assert (response.status, response.message[: len(message)]) == (status, message)
    data = np.arange(3, dtype=np.int32)
    _assert_identity(client.call(grpc_frame(identity_request(data))), data)


def test_unknown_model_error_status(client):
    response = client.call(grpc_frame(identity_request(np.arange(3, dtype=np.int32), "nope")))
    assert response.headers[":status"] == "200"
    assert response.status == "5"  # NOT_FOUND
    assert response.message == "Request for unknown model: 'nope' is not found"


def test_long_error_message_is_cut_and_says_so(client):
    """An error quoting a 20,000-character model name: its grpc-message is cut to 4 KiB with a
    note (grpcio's clients refuse metadata past 8-16 KiB, and would show that instead of the
    status); the connection serves on."""
    name = "m" * 20_000
    response = client.call(grpc_frame(identity_request(np.arange(3, dtype=np.int32), name)))
    assert response.status == "5"
    assert response.message.startswith("Request for unknown model: 'mmmm")
    assert len(response.message) <= 4096
    cut = 20_000 + len("Request for unknown model: '' is not found") - response.message.index("...")
    assert response.message.endswith(
        f"... ({cut} more characters cut: a gRPC status message is limited to 4 KiB)"
    )
    data = np.arange(3, dtype=np.int32)
    _assert_identity(client.call(grpc_frame(identity_request(data))), data)


# --- compression --------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request(client, encoding):
    data = np.arange(1000, dtype=np.int32)
    message = identity_request(data)
    if encoding == "gzip":
        body = gzip_frame(message)
    else:
        body = grpc_frame(zlib.compress(message), compressed=True)
    response = client.call(body, grpc_encoding=encoding)
    _assert_identity(response, data)


def test_unknown_encoding_with_compressed_flag_is_an_error(client):
    body = grpc_frame(b"not really snappy", compressed=True)
    response = client.call(body, grpc_encoding="snappy")
    assert response.status == "12"
    assert "snappy" in response.message


def test_compressed_flag_without_encoding_is_an_error(client):
    response = client.call(grpc_frame(identity_request(np.arange(2, dtype=np.int32)), True))
    assert response.status == "13"


def test_unknown_encoding_without_compressed_flag_is_fine(client):
    data = np.arange(4, dtype=np.int32)
    response = client.call(grpc_frame(identity_request(data)), grpc_encoding="snappy")
    _assert_identity(response, data)


# --- deadlines and cancellation -----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_grpc_timeout_is_deadline_exceeded(server, client):
    started = time.monotonic()
    response = client.call(grpc_frame(float_request("slow", "SECONDS", 2.0)), grpc_timeout="200m")
    elapsed = time.monotonic() - started
    assert response.status == "4", (response.status, response.message)
    assert response.message == "Deadline Exceeded"
    assert 0.15 < elapsed < 1.9  # before the model is done (2 s)
    # Still healthy: the same connection serves the next calls, the slow model included.
    data = np.arange(5, dtype=np.int32)
    _assert_identity(client.call(grpc_frame(identity_request(data))), data)
    response = client.call(grpc_frame(float_request("slow", "SECONDS", 0.0)), grpc_timeout="20S")
    assert response.status == "0", response.message


@pytest.mark.timeout(60)
def test_client_reset_cancels_the_call(server, client):
    def cancelled() -> float:
        values = _values(_scrape(server)[1])
        return _value(
            values,
            "nv_inference_request_failure",
            model="cancel_waiter",
            version="1",
            reason="CANCELED",
        )

    before = cancelled()
    mark = len(server.output)
    stream_id = client.start(grpc_frame(int_request("cancel_waiter", "IN", 1)))
    _wait_for_log(server, "cancel_waiter: started", mark)
    client.reset(stream_id)
    _wait_for_log(server, "cancel_waiter: cancelled=True", mark)
    deadline = time.monotonic() + 20
    while cancelled() != before + 1:  # counted when the supervisor sees the request end
        assert time.monotonic() < deadline, cancelled()
        time.sleep(0.05)  # polling the metrics endpoint
    # Nothing more arrives on the reset stream, and the connection serves on.
    data = np.arange(6, dtype=np.int32)
    _assert_identity(client.call(grpc_frame(identity_request(data))), data)
    assert not client.responses[stream_id].done


# --- the connection -----------------------------------------------------------------------------


def test_garbage_instead_of_the_preface_closes_the_connection(server):
    with RawClient(server.grpc_port, preface=False) as raw:
        raw.sock.sendall(b"GET / HTTP/1.1\r\nHost: shoal\r\n\r\n")
        frames = []
        while (frame := raw.read_frame()) is not None:
            frames.append(frame)
        goaways = [f for f in frames if isinstance(f, GoAwayFrame)]
        assert len(goaways) == 1 and goaways[0].error_code == 0x1  # PROTOCOL_ERROR
    with H2Client(server.grpc_port) as client:
        data = np.arange(3, dtype=np.int32)
        _assert_identity(client.call(grpc_frame(identity_request(data))), data)


def test_frames_on_a_stream_the_server_closed_are_ignored(server):
    """The server answers an unknown method at once and resets the stream (NO_ERROR) while the
    client still sends its request: the client's DATA and trailers that cross the reset are
    ignored (RFC 9113 section 5.1), not a connection error."""
    with RawClient(server.grpc_port) as raw:
        headers = request_headers(server.grpc_port, path="/inference.GRPCInferenceService/Nope")
        raw.send(HeadersFrame(1, data=raw.block(headers), flags=["END_HEADERS"]))
        response = raw.read_stream(1)
        assert response.status == "12"
        raw.send(
            DataFrame(1, data=grpc_frame(b"late")),
            HeadersFrame(
                1, data=raw.block([("x-trailer", "1")]), flags=["END_HEADERS", "END_STREAM"]
            ),
        )
        seen = raw.ping(b"12345678")
        assert not [f for f in seen if isinstance(f, GoAwayFrame)], seen
        data = np.arange(4, dtype=np.int32)
        body = grpc_frame(identity_request(data))
        raw.send(
            HeadersFrame(
                3, data=raw.block(request_headers(server.grpc_port)), flags=["END_HEADERS"]
            ),
            DataFrame(3, data=body, flags=["END_STREAM"]),
        )
        _assert_identity(raw.read_stream(3), data)


@pytest.mark.timeout(30)
def test_client_goaway_lets_the_running_call_finish(server):
    with RawClient(server.grpc_port) as raw:
        mark = len(server.output)
        raw.send(
            HeadersFrame(
                1, data=raw.block(request_headers(server.grpc_port)), flags=["END_HEADERS"]
            ),
            DataFrame(
                1, data=grpc_frame(float_request("slow", "SECONDS", 0.3)), flags=["END_STREAM"]
            ),
        )
        _wait_for_log(server, "slow: executing", mark)
        raw.send(GoAwayFrame(0, last_stream_id=0, error_code=NO_ERROR))
        response = raw.read_stream(1)
        assert response.status == "0", response.message
        assert raw.read_frame() is None  # then the server closes the connection


@pytest.mark.timeout(90)
def test_graceful_stop():
    """SIGTERM with a call in flight: the call completes with status 0, GOAWAY arrives, a new
    stream is refused without harm to the streams still open, and the process exits 0."""
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=_args("identity", "slow")) as server:
        port = server.grpc_port
        with RawClient(port) as raw:
            slow = grpc_frame(float_request("slow", "SECONDS", 1.0))
            headers = raw.block(request_headers(port))
            raw.send(
                HeadersFrame(1, data=headers, flags=["END_HEADERS"]),
                DataFrame(1, data=slow, flags=["END_STREAM"]),
            )
            # Stream 3 stays open: its request is not sent yet.
            raw.send(HeadersFrame(3, data=raw.block(request_headers(port)), flags=["END_HEADERS"]))
            _wait_for_log(server, "slow: executing", 0)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            others: list = []
            response = raw.read_stream(1, others)
            assert response.status == "0", (response.status, response.message)
            (message,) = response.messages()
            assert output_array(message, np.float32).tolist() == [1.0]
            while not [f for f in others if isinstance(f, GoAwayFrame)]:
                frame = raw.read_frame()
                assert frame is not None, "EOF before GOAWAY"
                others.append(frame)
            (goaway,) = [f for f in others if isinstance(f, GoAwayFrame)]
            assert goaway.error_code == NO_ERROR
            assert goaway.last_stream_id == 3
            # A new stream after GOAWAY: refused, its DATA ignored, the connection kept.
            data = np.arange(4, dtype=np.int32)
            raw.send(
                HeadersFrame(5, data=raw.block(request_headers(port)), flags=["END_HEADERS"]),
                DataFrame(5, data=grpc_frame(identity_request(data)), flags=["END_STREAM"]),
            )
            refused = raw.read_stream(5, others)
            assert refused.reset == REFUSED_STREAM
            seen = raw.ping(b"stopping")
            assert not [f for f in seen if isinstance(f, GoAwayFrame)], seen
            # Stream 3 finishes; the server drains, so its inference is refused (UNAVAILABLE).
            raw.send(DataFrame(3, data=grpc_frame(identity_request(data)), flags=["END_STREAM"]))
            last = raw.read_stream(3)
            assert last.status == "14", (last.status, last.message)
            assert "shutting down" in last.message
            while raw.read_frame() is not None:  # then the server closes the connection
                pass
        assert server.proc.wait(30) == 0, server.output  # by itself: no second signal
        assert server.stop() == 0  # (checks that no stub process is left)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.timeout(60)
def test_graceful_stop_ends_an_idle_stream_call():
    """An open ModelStreamInfer call whose requests are all answered does not hold the shutdown
    for the exit timeout (30 s): it ends with status 0, and the process exits 0."""
    args = _args("identity", "decoupled_repeat")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args) as server:
        port = server.grpc_port
        with RawClient(port) as raw:
            request = grpc_frame(int_request("decoupled_repeat", "COUNT", 2))
            raw.send(
                HeadersFrame(
                    1, data=raw.block(request_headers(port, STREAM_PATH)), flags=["END_HEADERS"]
                ),
                DataFrame(1, data=request),
            )
            body = bytearray()
            indexes: list[int] = []
            while len(indexes) < 2:  # both responses, the stream still open
                frame = raw.read_frame()
                assert frame is not None
                if isinstance(frame, DataFrame) and frame.stream_id == 1:
                    body += frame.data
                    indexes = _stream_indexes(body)
            assert indexes == [0, 1]
            started = time.monotonic()
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            response = raw.read_stream(1)
            assert response.status == "0", (response.status, response.message)
            while raw.read_frame() is not None:
                pass
            assert server.proc.wait(30) == 0, server.output
            assert time.monotonic() - started < 10
        assert server.stop() == 0


def _stream_indexes(body: bytearray) -> list[int]:
    """INDEX of each whole ModelStreamInferResponse in ``body`` (empty responses skipped)."""
    indexes = []
    offset = 0
    while len(body) - offset >= 5:
        size = int.from_bytes(body[offset + 1 : offset + 5], "big")
        if len(body) - offset - 5 < size:
            break
        reply = pb.ModelStreamInferResponse.FromString(bytes(body[offset + 5 : offset + 5 + size]))
        assert not reply.error_message, reply.error_message
        if reply.infer_response.outputs:
            index = output_array(reply.infer_response.SerializeToString(), np.int32)
            indexes.append(int(index[0]))
        offset += 5 + size
    return indexes
