"""Two small HTTP/2 clients for the native gRPC server's frame-level tests.

:class:`H2Client` drives the ``h2`` library (``H2Connection(client_side=True)``) over a plain
socket: h2 checks what the server sends (frame sizes, flow-control windows, header blocks) and
raises on a violation. :class:`RawClient` writes and reads frames itself (``hyperframe`` and
``hpack``), for what h2 refuses to send or to read: CONTINUATION frames, padding, garbage,
frames after a GOAWAY.
"""

from __future__ import annotations

import gzip
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import hpack
import numpy as np
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingAckReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    SettingsAcknowledged,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.settings import SettingCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from shoal.protos import grpc_service_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
REFUSED_STREAM = 0x7
NO_ERROR = 0x0


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    """gRPC's length-prefixed message: a compressed flag and a 4-byte big-endian length."""
    return struct.pack(">BI", int(compressed), len(message)) + message


def grpc_messages(data: bytes) -> list[bytes]:
    """The messages of a response body (uncompressed: shoal never compresses responses)."""
    messages = []
    offset = 0
    while offset < len(data):
        flag, size = struct.unpack_from(">BI", data, offset)
        assert flag == 0, "shoal sent a compressed message"
        offset += 5
        messages.append(data[offset : offset + size])
        offset += size
    assert offset == len(data), "a truncated message"
    return messages


def identity_request(data: np.ndarray, model: str = "identity") -> bytes:
    """A serialized ModelInferRequest sending ``data`` (UINT8 or INT32, 1-D) to the identity
    model as ``IN_<TYPE>``."""
    datatype = {np.dtype(np.uint8): "UINT8", np.dtype(np.int32): "INT32"}[data.dtype]
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype)
    tensor.shape.extend(data.shape)
    request.raw_input_contents.append(data.tobytes())
    return request.SerializeToString()


def float_request(model: str, name: str, value: float) -> bytes:
    """A ModelInferRequest with one FP32 [1] input (the slow model's SECONDS)."""
    return _scalar_request(model, name, "FP32", np.array([value], np.float32))


def int_request(model: str, name: str, value: int) -> bytes:
    return _scalar_request(model, name, "INT32", np.array([value], np.int32))


def _scalar_request(model: str, name: str, datatype: str, value: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype)
    tensor.shape.append(1)
    request.raw_input_contents.append(value.tobytes())
    return request.SerializeToString()


def output_array(response: bytes, dtype: Any) -> np.ndarray:
    """The first output of a serialized ModelInferResponse, as a 1-D array."""
    parsed = pb.ModelInferResponse.FromString(response)
    return np.frombuffer(parsed.raw_output_contents[0], dtype=dtype)


def request_headers(
    port: int, path: str = INFER_PATH, extra: tuple[tuple[str, str], ...] = (), **overrides: str
) -> list[tuple[str, str]]:
    headers = {
        ":method": "POST",
        ":scheme": "http",
        ":path": path,
        ":authority": f"127.0.0.1:{port}",
        "content-type": "application/grpc",
        "te": "trailers",
    }
    for name, value in overrides.items():  # method="GET" is :method, grpc_timeout grpc-timeout
        name = name.replace("_", "-")
        headers[f":{name}" if f":{name}" in headers else name] = value
    return [*headers.items(), *extra]


@dataclass
class Response:
    """What one stream received."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    ended: bool = False
    reset: int | None = None  # the RST_STREAM error code, if the server reset the stream
    data_frames: list[int] = field(default_factory=list)  # each DATA frame's flow-controlled size
    blocks: list[bytes] = field(default_factory=list)  # the header blocks as sent (RawClient)

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    @property
    def status(self) -> str | None:
        """grpc-status, from the trailers or a trailers-only response."""
        return self.trailers.get("grpc-status", self.headers.get("grpc-status"))

    @property
    def message(self) -> str | None:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message"))

    def messages(self) -> list[bytes]:
        return grpc_messages(bytes(self.data))


def _text(headers: Any) -> dict[str, str]:
    return {
        (name.decode() if isinstance(name, bytes) else name): (
            value.decode() if isinstance(value, bytes) else value
        )
        for name, value in headers
    }


class H2Client:
    """An h2 client connection to ``127.0.0.1:port``; ``settings`` are the client's own
    (e.g. a small ``SETTINGS_INITIAL_WINDOW_SIZE``), in force once the server acknowledged them.

    Received DATA is acknowledged (WINDOW_UPDATE, as h2 decides) only after it has been read.
    """

    def __init__(self, port: int, settings: dict[int, int] | None = None, timeout: float = 30):
        self.port = port
        self.ack = True  # False: received DATA is not acknowledged (the windows only shrink)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.responses: dict[int, Response] = {}
        self.pings: list[bytes] = []
        self.terminated: ConnectionTerminated | None = None
        self.closed = False
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.flush()
        acks = 2 if settings else 1
        remote = False
        while acks or not remote:  # the server's SETTINGS, and its ACK of each of ours
            for event in self.pump():
                acks -= isinstance(event, SettingsAcknowledged)
                remote = remote or isinstance(event, RemoteSettingsChanged)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self) -> list[Any]:
        """Read once from the socket and handle what arrived; returns h2's events."""
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            self.closed = True
            raise ConnectionError("the server closed the connection")
        events = self.conn.receive_data(chunk)
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            response = self.responses.get(stream_id) if stream_id else None
            if isinstance(event, ResponseReceived):
                assert response is not None
                response.headers = _text(event.headers)
            elif isinstance(event, DataReceived):
                assert response is not None
                response.data += event.data
                response.data_frames.append(event.flow_controlled_length)
                if self.ack:  # read: only now give the window back
                    self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, TrailersReceived):
                assert response is not None
                response.trailers = _text(event.headers)
            elif isinstance(event, StreamEnded):
                assert response is not None
                response.ended = True
            elif isinstance(event, StreamReset):
                assert response is not None
                response.reset = int(event.error_code)
            elif isinstance(event, PingAckReceived):
                self.pings.append(event.ping_data)
            elif isinstance(event, ConnectionTerminated):
                self.terminated = event
        self.flush()
        return events

    def start(
        self,
        body: bytes | None,
        path: str = INFER_PATH,
        extra: tuple[tuple[str, str], ...] = (),
        end_stream: bool = True,
        **overrides: str,
    ) -> int:
        """Open a stream: HEADERS, then ``body`` (None: no DATA; HEADERS end the stream if
        ``end_stream``). Returns the stream id."""
        stream_id: int = self.conn.get_next_available_stream_id()
        self.responses[stream_id] = Response()
        headers = request_headers(self.port, path, extra, **overrides)
        self.conn.send_headers(stream_id, headers, end_stream=body is None and end_stream)
        self.flush()
        if body is not None:
            self.send_body(stream_id, body, end_stream)
        return stream_id

    def send_body(self, stream_id: int, body: bytes, end_stream: bool = True) -> None:
        """Send ``body`` within the server's windows and frame size."""
        view = memoryview(body)
        while True:
            window = self.conn.local_flow_control_window(stream_id)
            size = min(len(view), window, self.conn.max_outbound_frame_size)
            if size or not view:
                last = size == len(view)
                self.conn.send_data(stream_id, bytes(view[:size]), end_stream=end_stream and last)
                self.flush()
                view = view[size:]
                if last:
                    return
            else:
                self.pump()  # wait for WINDOW_UPDATE

    def wait(self, stream_id: int) -> Response:
        response = self.responses[stream_id]
        while not response.done:
            self.pump()
        return response

    def call(self, body: bytes | None, **kwargs: Any) -> Response:
        """A whole unary call: request, then every frame until the stream ends."""
        return self.wait(self.start(body, **kwargs))

    def ping(self, payload: bytes) -> None:
        """Send PING and wait for its ACK."""
        count = len(self.pings)
        self.conn.ping(payload)
        self.flush()
        while len(self.pings) == count:
            self.pump()

    def reset(self, stream_id: int, code: int = 0x8) -> None:
        self.conn.reset_stream(stream_id, code)
        self.flush()


class RawClient:
    """HTTP/2 by hand: frames written as given (``hyperframe``), header blocks encoded with
    ``hpack``, frames read one by one. The client's windows are the largest HTTP/2 allows, so
    the server is never held back by them."""

    def __init__(
        self,
        port: int,
        timeout: float = 30,
        preface: bool = True,
        settings: dict[int, int] | None = None,
    ) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._buffer = bytearray()
        if preface:
            ours = {SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1, **(settings or {})}
            more = WindowUpdateFrame(0, window_increment=2**31 - 1 - 65_535)
            self.sock.sendall(
                PREFACE + SettingsFrame(0, settings=ours).serialize() + more.serialize()
            )
            # The server's SETTINGS (acknowledged by read_frame) and its ACK of ours: after
            # this the server has read all the client sent, and the connection is quiet.
            acked = remote = False
            while not (acked and remote):
                frame = self.read_frame()
                assert frame is not None, "EOF during the HTTP/2 handshake"
                if isinstance(frame, SettingsFrame):
                    acked = acked or "ACK" in frame.flags
                    remote = remote or "ACK" not in frame.flags

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, *frames: Frame) -> None:
        self.sock.sendall(b"".join(frame.serialize() for frame in frames))

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        data: bytes = self.encoder.encode(headers)
        return data

    def read_frame(self) -> Frame | None:
        """The next frame, None at EOF; SETTINGS are acknowledged here."""
        while True:
            if len(self._buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(bytes(self._buffer[:9])))
                if len(self._buffer) >= 9 + length:
                    frame.parse_body(memoryview(bytes(self._buffer[9 : 9 + length])))
                    del self._buffer[: 9 + length]
                    if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                        self.send(SettingsFrame(0, flags=["ACK"]))
                    return frame
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk

    def read_stream(self, stream_id: int, others: list[Frame] | None = None) -> Response:
        """Frames until ``stream_id`` ends (END_STREAM or RST_STREAM); frames of other streams
        and of the connection go to ``others``. Raises at EOF."""
        response = Response()
        block = bytearray()
        first_flags: set[str] = set()
        while not response.done:
            frame = self.read_frame()
            if frame is None:
                raise ConnectionError(f"EOF before stream {stream_id} ended")
            if isinstance(frame, HeadersFrame | ContinuationFrame):
                if isinstance(frame, HeadersFrame):
                    first_flags = set(frame.flags)
                block += frame.data
                if "END_HEADERS" not in frame.flags:
                    continue
                headers = _text(self.decoder.decode(bytes(block), raw=True))
                if frame.stream_id != stream_id:
                    block.clear()
                    if others is not None:
                        others.append(frame)
                    continue
                response.blocks.append(bytes(block))
                block.clear()
                if response.headers:
                    response.trailers = headers
                else:
                    response.headers = headers
                if "END_STREAM" in first_flags:
                    response.ended = True
            elif frame.stream_id == stream_id and isinstance(frame, DataFrame):
                response.data += frame.data
                response.data_frames.append(frame.flow_controlled_length)
                if "END_STREAM" in frame.flags:
                    response.ended = True
            elif frame.stream_id == stream_id and isinstance(frame, RstStreamFrame):
                response.reset = frame.error_code
            elif others is not None:
                others.append(frame)
        return response

    def ping(self, payload: bytes) -> list[Frame]:
        """PING, then the frames up to its ACK (returned, the ACK last)."""
        self.send(PingFrame(0, opaque_data=payload))
        seen = []
        while True:
            frame = self.read_frame()
            if frame is None:
                raise ConnectionError("EOF before the PING ACK")
            seen.append(frame)
            if isinstance(frame, PingFrame) and "ACK" in frame.flags:
                assert frame.opaque_data == payload
                return seen


def gzip_frame(message: bytes) -> bytes:
    return grpc_frame(gzip.compress(message), compressed=True)


__all__ = [
    "INFER_PATH",
    "NO_ERROR",
    "REFUSED_STREAM",
    "ContinuationFrame",
    "DataFrame",
    "GoAwayFrame",
    "H2Client",
    "HeadersFrame",
    "RawClient",
    "Response",
    "RstStreamFrame",
    "float_request",
    "grpc_frame",
    "gzip_frame",
    "identity_request",
    "int_request",
    "output_array",
    "request_headers",
]
