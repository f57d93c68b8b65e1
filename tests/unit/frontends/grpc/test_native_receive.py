"""Large ModelInfer inputs received straight into a frontend worker's arena by the native gRPC
server: byte-exact whatever the DATA frames' sizes, and every block given back whether the
call is answered, fails, is reset by the client mid-upload, runs out of time or loses its
connection. The server, its HTTP/2 connection, the arena and the clients are real; the core
is a double that stages inputs as the worker's link does (``place``) and gives them back."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hyperframe.frame import DataFrame, HeadersFrame

from shoal.core import InferOutput, InferRequest, InferResponse
from shoal.frontends.grpc.native import NativeGrpcServer
from shoal.frontends.grpc.native_split import RECEIVE_FROM
from shoal.frontends.workers.arenas import StagingArena
from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, RawClient, grpc_frame, request_headers
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore

pytestmark = pytest.mark.timeout(60)

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


class _StagingCore(FullCore):
    """Each input placed in the arena (as the worker's link does), echoed from there, and its
    block given back at once (as the core does once the stub is done)."""

    def __init__(self, arena: StagingArena) -> None:
        super().__init__()
        self.arena = arena
        #: The arena bytes in use when each call reached the core, before staging.
        self.received_bytes: list[int] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.received_bytes.append(self.arena.arena.used_bytes)
        outputs = []
        for tensor in request.inputs:
            view = memoryview(tensor.data)
            block = self.arena.place(view)
            data = bytes(view) if block is None else bytes(self.arena.arena.view(block))
            if block is not None:
                self.arena.free([block.segment, block.offset, block.nbytes])
            outputs.append(InferOutput(tensor.name, tensor.datatype, tensor.shape, data))
        return InferResponse(request.model_name, "1", request.id, outputs)


@pytest.fixture(scope="module")
def served(loop_thread: LoopThread) -> Iterator[tuple[int, _StagingCore]]:
    ours, theirs = socket.socketpair()
    arena = StagingArena(
        1 << 32,
        ours,
        initial_bytes=32 << 20,
        growth_bytes=8 << 20,
        limit_bytes=64 << 20,
        on_retired=lambda index: None,
    )
    core = _StagingCore(arena)
    server = NativeGrpcServer(core, receive_into=arena)  # type: ignore[arg-type]
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        yield port, core
    finally:
        loop_thread.run(server.stop(None))
        arena.close()
        theirs.close()


def _request(sizes: list[int], datatype: str = "UINT8") -> tuple[bytes, list[bytes]]:
    request = pb.ModelInferRequest(model_name="echo", id="r")
    payloads = []
    rng = np.random.default_rng(len(sizes))
    for index, size in enumerate(sizes):
        request.inputs.add(name=f"IN{index}", datatype=datatype, shape=[size])
        payloads.append(rng.integers(0, 256, size, np.uint8).tobytes())
    request.raw_input_contents.extend(payloads)
    return request.SerializeToString(), payloads


def _outputs(data: bytes) -> list[bytes]:
    return list(pb.ModelInferResponse.FromString(data[5:]).raw_output_contents)


def _used(loop_thread: LoopThread, core: _StagingCore) -> int:
    async def used() -> int:
        return core.arena.arena.used_bytes

    return loop_thread.run(used())


def _wait_empty(loop_thread: LoopThread, core: _StagingCore) -> None:
    """Poll until the arena holds nothing (the server handles the client's frames apart from
    the test's thread); fails after 10 s."""
    deadline = time.monotonic() + 10
    while _used(loop_thread, core):
        assert time.monotonic() < deadline, "the arena still holds blocks"
        time.sleep(0.01)


def test_large_inputs_come_in_the_arena_and_go_back(served, loop_thread) -> None:
    port, core = served
    message, payloads = _request([4 << 20, 100, RECEIVE_FROM, 3 << 20])
    with H2Client(port) as client:
        for _ in range(3):
            response = client.call(grpc_frame(message))
            assert response.status == "0", response.message
            assert _outputs(response.data) == payloads
    # Received before the core was called: the three large inputs were already in the arena.
    assert core.received_bytes[-1] >= (7 << 20) + RECEIVE_FROM
    _wait_empty(loop_thread, core)


@pytest.mark.parametrize("frame", [1, 5, 7, 4093, 16384, 65536 + 3])
def test_any_frame_size_gives_the_same_bytes(served, loop_thread, frame: int) -> None:
    port, core = served
    message, payloads = _request([RECEIVE_FROM + 11, 3, (RECEIVE_FROM if frame > 7 else 0) + 5])
    body = grpc_frame(message)
    with RawClient(port) as raw:
        raw.send(
            HeadersFrame(
                1, data=raw.block(request_headers(port, INFER_PATH)), flags=["END_HEADERS"]
            )
        )
        frames = [DataFrame(1, data=body[at : at + frame]) for at in range(0, len(body), frame)]
        frames[-1].flags.add("END_STREAM")
        for at in range(0, len(frames), 512):
            raw.send(*frames[at : at + 512])
        response = raw.read_stream(1)
    assert response.status == "0", response.message
    assert _outputs(response.data) == payloads
    _wait_empty(loop_thread, core)


def test_a_call_reset_mid_upload_gives_its_blocks_back(served, loop_thread) -> None:
    port, core = served
    message, _ = _request([4 << 20, 2 << 20])
    body = grpc_frame(message)
    with H2Client(port) as client:
        stream_id = client.start(body[: len(body) - 1000], end_stream=False)
        client.ping(b"uploaded")  # the server has read what came before the PING
        assert _used(loop_thread, core) >= 6 << 20
        client.reset(stream_id)
        client.ping(b"reset\x00\x00\x00")
        assert _used(loop_thread, core) == 0
        assert client.call(grpc_frame(message)).status == "0"  # the connection serves on
    _wait_empty(loop_thread, core)


def test_a_connection_lost_mid_upload_gives_its_blocks_back(served, loop_thread) -> None:
    port, core = served
    message, _ = _request([4 << 20])
    body = grpc_frame(message)
    client = H2Client(port)
    client.start(body[: len(body) // 2], end_stream=False)
    client.ping(b"uploaded")
    assert _used(loop_thread, core) >= 4 << 20
    client.close()
    _wait_empty(loop_thread, core)


def test_a_deadline_mid_upload_gives_its_blocks_back(served, loop_thread) -> None:
    port, core = served
    message, _ = _request([4 << 20])
    body = grpc_frame(message)
    with H2Client(port) as client:
        stream_id = client.start(body[: len(body) // 2], end_stream=False, grpc_timeout="200m")
        response = client.wait(stream_id)
        assert response.status == "4", response.message  # DEADLINE_EXCEEDED
    _wait_empty(loop_thread, core)


def test_a_rejected_request_gives_its_blocks_back(served, loop_thread) -> None:
    port, core = served
    message, _ = _request([RECEIVE_FROM * 2], datatype="FLOAT99")
    with H2Client(port) as client:
        response = client.call(grpc_frame(message))
        assert response.status == "3", response.message  # INVALID_ARGUMENT
        assert "FLOAT99" in (response.message or "")
        wrong_size = pb.ModelInferRequest.FromString(_request([RECEIVE_FROM * 2])[0])
        wrong_size.inputs[0].shape[0] = 7
        response = client.call(grpc_frame(wrong_size.SerializeToString()))
        assert response.status == "3", response.message
    _wait_empty(loop_thread, core)


def test_a_second_message_on_a_unary_call_gives_both_back(served, loop_thread) -> None:
    port, core = served
    message, _ = _request([RECEIVE_FROM * 2])
    with H2Client(port) as client:
        response = client.call(grpc_frame(message) * 2)
        assert response.status == "12", response.message  # UNIMPLEMENTED
    _wait_empty(loop_thread, core)


def test_a_compressed_request_is_not_received_in_parts(served, loop_thread) -> None:
    port, core = served
    message, payloads = _request([RECEIVE_FROM * 3])
    with H2Client(port) as client:
        response = client.call(
            grpc_frame(gzip.compress(message), compressed=True), grpc_encoding="gzip"
        )
        assert response.status == "0", response.message
        assert _outputs(response.data) == payloads
    assert core.received_bytes[-1] == 0
    _wait_empty(loop_thread, core)


def test_the_arena_full_falls_back_to_the_message(served, loop_thread) -> None:
    """An input larger than the arena's limit (64 MiB) is received in the message buffer and
    sent inline, as before."""
    port, core = served
    message, payloads = _request([RECEIVE_FROM, 65 << 20])
    with H2Client(port) as client:
        response = client.call(grpc_frame(message))
        assert response.status == "0", response.message
        assert _outputs(response.data) == payloads
    _wait_empty(loop_thread, core)


def test_a_message_over_the_limit_is_refused_before_anything_is_received(loop_thread) -> None:
    ours, theirs = socket.socketpair()
    arena = StagingArena(
        1 << 32,
        ours,
        initial_bytes=8 << 20,
        growth_bytes=8 << 20,
        limit_bytes=8 << 20,
        on_retired=lambda index: None,
    )
    limit = 1 << 20
    core = _StagingCore(arena)
    server = NativeGrpcServer(core, max_message_bytes=limit, receive_into=arena)  # type: ignore[arg-type]
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        message, _ = _request([2 << 20])
        with H2Client(port) as client:
            response = client.call(grpc_frame(message))
            assert response.status == "8", response.message  # RESOURCE_EXHAUSTED
            assert (
                response.message == f"Received message larger than max ({len(message)} vs. {limit})"
            )
            assert _used(loop_thread, core) == 0
            small, payloads = _request([RECEIVE_FROM * 2])
            response = client.call(grpc_frame(small))
            assert response.status == "0", response.message
            assert _outputs(response.data) == payloads
    finally:
        loop_thread.run(server.stop(None))
        arena.close()
        theirs.close()


def test_a_large_bytes_input_is_received_in_the_arena_and_checked(served, loop_thread) -> None:
    port, core = served
    elements = [bytes([index % 251]) * 1000 for index in range(100)]  # ~100 KiB of BYTES
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="IN0", datatype="BYTES", shape=[len(elements)])
    request.raw_input_contents.append(raw)
    with H2Client(port) as client:
        response = client.call(grpc_frame(request.SerializeToString()))
        assert response.status == "0", response.message
        assert _outputs(response.data) == [raw]
        assert core.received_bytes[-1] >= len(raw)  # it came in the arena
        request.inputs[0].shape[0] = len(elements) + 1  # one element more than sent
        response = client.call(grpc_frame(request.SerializeToString()))
        assert response.status == "3", response.message  # INVALID_ARGUMENT
    _wait_empty(loop_thread, core)
