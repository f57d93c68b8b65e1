"""The native gRPC server in-process, where an option has no command-line flag (the message size
limit) or a test needs the event loop's timing (a deadline that comes due in the iteration the
call starts). The core is the frontend tests' double; the server, its HTTP/2 connection and the
client (h2, or frames by hand) are real."""

from __future__ import annotations

import asyncio
import gzip
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, RstStreamFrame

from shoal.frontends.grpc.native import NativeGrpcServer
from shoal.frontends.grpc.native_messages import inflate
from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, RawClient, grpc_frame, request_headers
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import GATED, FullCore

pytestmark = pytest.mark.timeout(30)

LIMIT = 4096


class AsyncioLoopThread(LoopThread):
    """LoopThread on the standard library's event loop instead of uvloop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-asyncio-loop")
        self._thread.start()


def echo_request(size: int, request_id: str = "") -> bytes:
    """A ModelInferRequest for the double's "echo" model with ``size`` bytes of FP32 data."""
    request = pb.ModelInferRequest(model_name="echo", id=request_id)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, size // 4])
    request.raw_input_contents.append(np.zeros(size // 4, np.float32).tobytes())
    return request.SerializeToString()


def request_of_exactly(size: int) -> bytes:
    """An echo request whose serialized size is exactly ``size`` bytes."""
    data = size - 200
    for filler in range(200):
        message = echo_request(data, "x" * filler)
        if len(message) == size:
            return message
    raise AssertionError(f"no echo request of {size} bytes")


@contextmanager
def serve(thread: LoopThread, **options: int) -> Iterator[int]:
    server = NativeGrpcServer(FullCore(), **options)  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    try:
        yield port
    finally:
        thread.run(server.stop(None))


@pytest.fixture(scope="module")
def port(loop_thread: LoopThread) -> Iterator[int]:
    with serve(loop_thread, max_message_bytes=LIMIT) as bound:
        yield bound


@pytest.fixture
def client(port: int) -> Iterator[H2Client]:
    with H2Client(port) as c:
        yield c


# --- the message size limit ---------------------------------------------------------------------


def test_a_message_at_the_limit_is_served(client: H2Client) -> None:
    message = request_of_exactly(LIMIT)
    response = client.call(grpc_frame(message))
    assert response.status == "0", response.message
    (reply,) = response.messages()
    assert len(pb.ModelInferResponse.FromString(reply).raw_output_contents[0]) == LIMIT - 200


def test_a_message_over_the_limit_is_resource_exhausted(client: H2Client) -> None:
    message = request_of_exactly(LIMIT + 4)
    response = client.call(grpc_frame(message))
    assert response.headers[":status"] == "200"
    assert response.status == "8"
    assert response.message == f"Received message larger than max ({LIMIT + 4} vs. {LIMIT})"
    assert not response.data
    assert client.call(grpc_frame(echo_request(64))).status == "0"  # the connection serves on


def test_the_limit_is_checked_on_the_declared_size(client: H2Client) -> None:
    """Only the 5-byte prefix of a 1 GiB message is sent: the answer comes at once."""
    stream_id = client.start(b"\x00" + (1 << 30).to_bytes(4, "big"), end_stream=False)
    response = client.wait(stream_id)
    assert response.status == "8"
    assert response.message == f"Received message larger than max ({1 << 30} vs. {LIMIT})"


def test_a_message_inflating_past_the_limit_is_resource_exhausted(client: H2Client) -> None:
    compressed = gzip.compress(bytes(1 << 20))  # 1 MiB of zeros: about 1 KiB
    assert len(compressed) < LIMIT
    response = client.call(grpc_frame(compressed, compressed=True), grpc_encoding="gzip")
    assert response.status == "8"
    assert response.message == (
        f"Received message larger than max (more than {LIMIT} bytes uncompressed)"
    )


def test_a_corrupt_compressed_message_is_internal(client: H2Client) -> None:
    response = client.call(grpc_frame(b"\x1f\x8b not gzip", compressed=True), grpc_encoding="gzip")
    assert response.status == "13"
    assert response.message is not None
    assert response.message.startswith("failed to decompress the request message")


# --- a deadline in the loop iteration that starts the call --------------------------------------


@pytest.fixture(scope="module")
def asyncio_thread() -> Iterator[LoopThread]:
    thread = AsyncioLoopThread()
    yield thread
    thread.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_deadline_due_as_the_call_starts(request: pytest.FixtureRequest, loop: str) -> None:
    """The loop is busy past the call's deadline while the request's last frame arrives, so
    the deadline timer runs after that frame is handled but before the call's task takes its
    first step: the task is cancelled before it starts. The call must still end with
    DEADLINE_EXCEEDED, not hang. (uvloop runs the timers of an iteration before the callbacks
    that I/O scheduled in the previous one; asyncio appends due timers behind that I/O's.)"""
    thread: LoopThread = request.getfixturevalue(
        "loop_thread" if loop == "uvloop" else "asyncio_thread"
    )
    with serve(thread) as port, RawClient(port, timeout=5) as raw:
        headers = raw.block(request_headers(port, grpc_timeout="50m"))
        raw.send(
            HeadersFrame(1, data=headers, flags=["END_HEADERS"]),
            DataFrame(1, data=grpc_frame(echo_request(16))),
        )
        raw.ping(b"received")  # the server has read all: the call is open, its deadline armed
        busy = threading.Event()

        def block() -> None:
            busy.set()
            time.sleep(0.3)  # the server's loop is busy past the deadline

        thread.call(block)
        assert busy.wait(5)
        raw.send(DataFrame(1, data=b"", flags=["END_STREAM"]))
        response = raw.read_stream(1)
        assert response.status == "4", (response.status, response.message)
        assert response.message == "Deadline Exceeded"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_stop_due_as_the_call_starts(request: pytest.FixtureRequest, loop: str) -> None:
    """As above, with the server's stop of its running calls in place of the deadline, for a
    method whose calls run in a task (ModelMetadata; ModelInfer's are stepped, begun at once):
    the call is stopped before its task's first step (a task cancelled then would never run
    its body). It must still end with CANCELLED and leave the server's running calls."""
    thread: LoopThread = request.getfixturevalue(
        "loop_thread" if loop == "uvloop" else "asyncio_thread"
    )
    server = NativeGrpcServer(FullCore())  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    running = server._calls.running
    path = "/inference.GRPCInferenceService/ModelMetadata"
    try:
        with RawClient(port, timeout=5) as raw:
            headers = raw.block(request_headers(port, path))
            raw.send(
                HeadersFrame(1, data=headers, flags=["END_HEADERS"]),
                DataFrame(
                    1, data=grpc_frame(pb.ModelMetadataRequest(name="echo").SerializeToString())
                ),
            )
            raw.ping(b"received")
            busy = threading.Event()

            def stop_calls() -> None:
                assert len(running) == 1, "the call's task was not made in the busy iteration"
                for call in list(running):
                    call.stop()

            def block() -> None:
                asyncio.get_running_loop().call_later(0.05, stop_calls)
                busy.set()
                time.sleep(0.3)  # the client's last frame arrives meanwhile

            thread.call(block)
            assert busy.wait(5)
            raw.send(DataFrame(1, data=b"", flags=["END_STREAM"]))
            response = raw.read_stream(1)
            assert response.status == "1", (response.status, response.message)
            assert response.message == "the server is shutting down"
            assert not running
    finally:
        thread.run(server.stop(None))


@contextmanager
def gated_call(
    thread: LoopThread, **headers: str
) -> Iterator[tuple[NativeGrpcServer, FullCore, RawClient]]:
    """A server whose core holds ModelInfer calls of the "gated" model until its gate opens,
    and a raw client whose stream 1 is such a call, its request sent whole and read."""
    core = FullCore()
    core.gate = thread.run(_event())
    server = NativeGrpcServer(core)  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    try:
        with RawClient(port, timeout=5) as raw:
            request = pb.ModelInferRequest.FromString(echo_request(16))
            request.model_name = GATED
            raw.send(
                HeadersFrame(
                    1, data=raw.block(request_headers(port, **headers)), flags=["END_HEADERS"]
                ),
                DataFrame(1, data=grpc_frame(request.SerializeToString()), flags=["END_STREAM"]),
            )
            raw.ping(b"received")  # the call's work has begun: it awaits the gate
            yield server, core, raw
    finally:
        thread.run(server.stop(None))


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_a_stepped_call_stopped_while_it_waits_is_cancelled(loop_thread: LoopThread) -> None:
    """A ModelInfer call (stepped by hand, no task) that waits on the core when the server
    stops: the future it awaits is cancelled, the core hears it, the call ends CANCELLED and
    leaves the server's running calls, and the stop waits for that."""
    with gated_call(loop_thread) as (server, core, raw):
        running = server._calls.running
        assert len(running) == 1
        loop_thread.run(server._cancel_calls())  # the stop's own wait for its calls
        response = raw.read_stream(1)
        assert response.status == "1", (response.status, response.message)
        assert response.message == "the server is shutting down"
        assert core.cancelled == 1
        assert not running


def test_a_stepped_call_past_its_deadline_while_it_waits(loop_thread: LoopThread) -> None:
    """A ModelInfer call waiting on the core past its grpc-timeout: DEADLINE_EXCEEDED, the
    core's wait cancelled, the call out of the running calls."""
    with gated_call(loop_thread, grpc_timeout="100m") as (server, core, raw):
        response = raw.read_stream(1)
        assert response.status == "4", (response.status, response.message)
        assert response.message == "Deadline Exceeded"
        assert core.cancelled == 1
        assert not server._calls.running


def test_a_stepped_call_reset_by_the_client_while_it_waits(loop_thread: LoopThread) -> None:
    """A ModelInfer call waiting on the core that the client resets (RST_STREAM CANCEL): the
    core's wait is cancelled and the call leaves the running calls; the connection serves on."""
    with gated_call(loop_thread) as (server, core, raw):
        raw.send(RstStreamFrame(1, error_code=8))
        raw.ping(b"was_read")
        assert loop_thread.run(_settled(core, server)) == (1, 0)


async def _settled(core: FullCore, server: NativeGrpcServer) -> tuple[int, int]:
    """The core's cancelled count and the running calls, once the cancel has been stepped."""
    for _ in range(100):
        if core.cancelled and not server._calls.running:
            break
        await asyncio.sleep(0)
    return core.cancelled, len(server._calls.running)


# --- message framing ----------------------------------------------------------------------------


def test_a_message_split_anywhere_is_reassembled(port: int) -> None:
    """Two messages on one ModelStreamInfer stream, split into two DATA frames at every byte:
    the prefixes and bodies are put back together whatever the cut."""
    first = pb.ModelInferRequest.FromString(echo_request(8, "a"))
    second = pb.ModelInferRequest.FromString(echo_request(12, "b"))
    body = grpc_frame(first.SerializeToString()) + grpc_frame(second.SerializeToString())
    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    with RawClient(port) as raw:
        for cut in range(len(body) + 1):
            stream_id = 2 * cut + 1
            block = raw.block(request_headers(port, path))
            raw.send(
                HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]),
                DataFrame(stream_id, data=body[:cut]),
                DataFrame(stream_id, data=body[cut:], flags=["END_STREAM"]),
            )
            response = raw.read_stream(stream_id)
            assert response.status == "0", (cut, response.message)
            replies = [pb.ModelStreamInferResponse.FromString(m) for m in response.messages()]
            assert [r.infer_response.id for r in replies] == ["a", "b"], cut
            sizes = [len(r.infer_response.raw_output_contents[0]) for r in replies]
            assert sizes == [8, 12], cut


# --- stream errors --------------------------------------------------------------------------


def _window_update(stream_id: int, increment: int) -> bytes:
    """WINDOW_UPDATE by hand: hyperframe will not build the invalid ones."""
    return struct.pack(">HBBBII", 0, 4, 0x8, 0, stream_id, increment)


@pytest.mark.parametrize(
    ("increment", "code"), [(0, 0x1), (2**31 - 1, 0x3)], ids=["zero", "overflow"]
)
def test_bad_stream_window_update_resets_the_stream(
    loop_thread: LoopThread, increment: int, code: int
) -> None:
    """A WINDOW_UPDATE of 0 (PROTOCOL_ERROR) or past 2^31-1 (FLOW_CONTROL_ERROR) on a stream
    resets that stream and cancels its call, not the connection; and when the server is
    stopping, the connection it left idle closes at once instead of at the end of the grace."""
    core = FullCore()
    core.gate = asyncio.Event()  # the "gated" model waits on it: the call stays running
    server = NativeGrpcServer(core)  # type: ignore[arg-type]
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        with RawClient(port, timeout=5) as raw:
            request = pb.ModelInferRequest(model_name="gated").SerializeToString()
            for stream_id in (1, 3):
                raw.send(
                    HeadersFrame(
                        stream_id, data=raw.block(request_headers(port)), flags=["END_HEADERS"]
                    ),
                    DataFrame(stream_id, data=grpc_frame(request), flags=["END_STREAM"]),
                )
            raw.ping(b"running!")
            raw.sock.sendall(_window_update(1, increment))
            response = raw.read_stream(1)
            assert response.reset == code
            raw.ping(b"still up")  # the connection, and stream 3, carry on
            stopping = loop_thread.submit(server.stop(grace=20))
            frames = []
            while not any(isinstance(f, GoAwayFrame) for f in frames):
                frame = raw.read_frame()
                assert frame is not None
                frames.append(frame)
            started = time.monotonic()
            raw.sock.sendall(_window_update(3, increment))
            assert raw.read_stream(3).reset == code
            assert raw.read_frame() is None  # idle and going away: closed
            stopping.result(timeout=10)
            assert time.monotonic() - started < 5
        assert core.cancelled == 2
    finally:
        loop_thread.run(server.stop(None))


# --- how many streams a client may open at once -------------------------------------------------


def test_streams_over_the_limit_are_refused_and_later_ones_served(loop_thread: LoopThread) -> None:
    with serve(loop_thread, max_concurrent_streams=2) as bound:
        with H2Client(bound) as client:  # h2 reads the advertised limit and keeps to it
            assert client.conn.remote_settings.max_concurrent_streams == 2
        with RawClient(bound) as raw:  # a client that does not keep to it
            headers = raw.block(request_headers(bound))
            # Two calls held open (no request message yet), then a third.
            raw.send(*(HeadersFrame(i, data=headers, flags=["END_HEADERS"]) for i in (1, 3, 5)))
            assert raw.read_stream(5).reset == 0x7  # REFUSED_STREAM: the client may retry it
            body = grpc_frame(echo_request(64))
            for stream_id in (1, 3):
                raw.send(DataFrame(stream_id, data=body, flags=["END_STREAM"]))
                assert raw.read_stream(stream_id).status == "0"
            # Both ended: a new call is served.
            raw.send(
                HeadersFrame(7, data=headers, flags=["END_HEADERS"]),
                DataFrame(7, data=body, flags=["END_STREAM"]),
            )
            assert raw.read_stream(7).status == "0"


@pytest.mark.parametrize("size", [0, 5, (1 << 20) - 1, 1 << 20, (3 << 20) + 7])
@pytest.mark.parametrize("gzipped", [True, False])
def test_inflate_in_pieces_gives_the_whole_message(size: int, gzipped: bool) -> None:
    message = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8).tobytes()
    wbits = 16 + zlib.MAX_WBITS if gzipped else zlib.MAX_WBITS
    packed = gzip.compress(message) if gzipped else zlib.compress(message)
    assert inflate(packed, wbits, 1 << 30) == message


def test_inflate_stops_past_the_limit() -> None:
    assert inflate(gzip.compress(bytes(8 << 20)), 16 + zlib.MAX_WBITS, 3 << 20) is None
    assert inflate(gzip.compress(bytes(3 << 20)), 16 + zlib.MAX_WBITS, 3 << 20) == bytes(3 << 20)


# --- repeated header blocks ---------------------------------------------------------------------


def test_repeated_header_blocks_are_each_read_as_their_own(client: H2Client) -> None:
    """A client's repeated calls send the same block (indexed headers): the server keeps what
    it read of each decoded list; calls alternating between blocks get each its own reading."""
    message = grpc_frame(echo_request(16))
    for _ in range(3):
        served = client.call(message)
        assert served.status == "0", served.message
        assert len(served.messages()) == 1
        unknown = client.call(message, path="/inference.GRPCInferenceService/Nope")
        assert (unknown.status, unknown.message) == ("12", "Method not found!")
        refused = client.call(message, content_type="text/plain")
        assert refused.headers[":status"] == "415"
        timed = client.call(message, grpc_timeout="10S")
        assert timed.status == "0", timed.message


# --- frames on streams not opened ---------------------------------------------------------------


def _raw_frame(kind: int, stream_id: int, payload: bytes) -> bytes:
    """A frame by hand (hyperframe will not build the invalid ones)."""
    return struct.pack(">HBBBI", 0, len(payload), kind, 0, stream_id) + payload


def _goaway_code(raw: RawClient) -> int | None:
    """The error code of the GOAWAY the server sends before it closes (None: no GOAWAY)."""
    while (frame := raw.read_frame()) is not None:
        if isinstance(frame, GoAwayFrame):
            return int(frame.error_code)
    return None


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_raw_frame(0x8, 99, struct.pack(">I", 10)), 0x1),  # WINDOW_UPDATE, idle stream
        (_raw_frame(0x3, 99, struct.pack(">I", 0x8)), 0x1),  # RST_STREAM, idle stream
        (_raw_frame(0x3, 0, struct.pack(">I", 0x8)), 0x1),  # RST_STREAM, stream 0
        (_raw_frame(0x3, 1, b"\0\0\x08"), 0x6),  # RST_STREAM of three bytes: FRAME_SIZE_ERROR
    ],
    ids=["window-update-idle", "rst-stream-idle", "rst-stream-zero", "rst-stream-short"],
)
def test_a_frame_on_a_stream_not_opened_ends_the_connection(
    port: int, frame: bytes, code: int
) -> None:
    """RFC 9113 sections 5.1 and 6.4: WINDOW_UPDATE or RST_STREAM on an idle stream (or
    RST_STREAM on stream 0) is a connection error of type PROTOCOL_ERROR."""
    with RawClient(port, timeout=5) as raw:
        raw.sock.sendall(frame)
        assert _goaway_code(raw) == code


def test_a_closed_streams_window_update_and_reset_are_ignored(port: int) -> None:
    """After a call ended, the client's credit and reset for its stream change nothing."""
    with RawClient(port, timeout=5) as raw:
        for stream_id in (1, 3):
            block = raw.block(request_headers(port))
            raw.send(
                HeadersFrame(stream_id, data=block, flags=["END_HEADERS"]),
                DataFrame(stream_id, data=grpc_frame(echo_request(64)), flags=["END_STREAM"]),
            )
            assert raw.read_stream(stream_id).status == "0"
            raw.sock.sendall(_raw_frame(0x8, stream_id, struct.pack(">I", 0)))  # even one of 0
            raw.sock.sendall(_raw_frame(0x3, stream_id, struct.pack(">I", 0x8)))
            seen = raw.ping(b"carry on")
            assert not [frame for frame in seen if isinstance(frame, GoAwayFrame)], seen


class _SlowLoadCore(FullCore):
    """A core whose model load is heard at once and then takes a while (the call's work
    awaits: a second launch of it would overlap the first)."""

    async def load_model(self, name, config_json=None, files=None):  # type: ignore[no-untyped-def]
        self.loads.append((name, config_json, files))
        await asyncio.sleep(0.05)


def test_trailers_after_the_end_of_a_request_run_its_method_at_most_once() -> None:
    """DATA with END_STREAM, then a HEADERS block with END_STREAM on the same stream (a peer's
    trailers after the end): a stream error STREAM_CLOSED (RFC 9113 section 5.1), the call
    cancelled as by a reset. A task-run method (RepositoryModelLoad) whose task had not begun
    is not launched a second time, nor run at all if the reset came before its first step."""
    thread = LoopThread()
    core = _SlowLoadCore()
    server = NativeGrpcServer(core)  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    path = "/inference.GRPCInferenceService/RepositoryModelLoad"
    try:
        with RawClient(port, timeout=5) as raw:
            headers = raw.block(request_headers(port, path))
            trailers = raw.block([("x-extra", "1")])
            body = pb.RepositoryModelLoadRequest(model_name="echo").SerializeToString()
            raw.send(
                HeadersFrame(1, data=headers, flags=["END_HEADERS"]),
                DataFrame(1, data=grpc_frame(body), flags=["END_STREAM"]),
                HeadersFrame(1, data=trailers, flags=["END_HEADERS", "END_STREAM"]),
            )
            response = raw.read_stream(1)
            raw.ping(b"settled!")
            assert response.reset == 0x5, response  # STREAM_CLOSED
            assert len(core.loads) <= 1, core.loads
    finally:
        thread.run(server.stop(None))
        thread.close()
