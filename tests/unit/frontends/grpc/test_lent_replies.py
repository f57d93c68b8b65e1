"""A ModelInfer reply is written from the response's own memory (no copy), and that memory is
given back only once its bytes have left the server: not while they wait for the client's
window, and surely once the stream or the connection is gone. The server, its HTTP/2
connection and the client (h2) are real; the core is the frontend tests' double, which counts
the responses released."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from h2.settings import SettingCodes

from shoal.frontends.grpc import native_call
from shoal.frontends.grpc.native import NativeGrpcServer
from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, grpc_frame
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore

pytestmark = pytest.mark.timeout(30)

SIZE = 1 << 20  # the reply is larger than the client's window (64 KiB)


def _request(data: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[data.size])
    request.raw_input_contents.append(data.tobytes())
    return request.SerializeToString()


@pytest.fixture
def served(loop_thread: LoopThread) -> Iterator[tuple[FullCore, int]]:
    core = FullCore()
    server = NativeGrpcServer(core)  # type: ignore[arg-type]
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        yield core, port
    finally:
        loop_thread.run(server.stop(None))


def _held_client(port: int) -> H2Client:
    """A client with the default 64 KiB windows that gives no credit back (yet)."""
    client = H2Client(port, settings={SettingCodes.INITIAL_WINDOW_SIZE: 65_535})
    client.ack = False
    return client


def _answered_and_held(client: H2Client, core: FullCore, data: np.ndarray) -> int:
    """Start a call; return once the core has answered it and the window holds the reply."""
    stream_id = client.start(grpc_frame(_request(data)))
    deadline = time.monotonic() + 10
    while core.issued < 1 or sum(client.responses[stream_id].data_frames) < 65_535:
        assert time.monotonic() < deadline, "the reply never filled the client's window"
        client.pump()
    return stream_id


def _wait_released(core: FullCore, count: int) -> None:
    deadline = time.monotonic() + 10
    while core.released < count:  # the server's loop releases after its next write
        assert time.monotonic() < deadline, f"released {core.released} of {count}"
        time.sleep(0.01)


def test_the_reply_is_held_until_the_client_reads_it_then_released(
    served: tuple[FullCore, int],
) -> None:
    core, port = served
    data = np.random.default_rng(3).random(SIZE // 4, dtype=np.float32)
    with _held_client(port) as client:
        stream_id = _answered_and_held(client, core, data)
        client.ping(b"in sync!")  # the server has handled all the client sent
        assert core.released == 0  # most of the reply still waits for the window, unsent
        client.ack = True
        client.conn.increment_flow_control_window(1 << 30)
        client.conn.increment_flow_control_window(1 << 30, stream_id)
        client.flush()
        response = client.wait(stream_id)
        assert response.status == "0", response.message
        reply = pb.ModelInferResponse.FromString(response.messages()[0])
        assert reply.raw_output_contents[0] == data.tobytes()  # byte-exact, from lent memory
        assert max(response.data_frames) == 16_384  # the client's maximum frame size
        _wait_released(core, 1)


def test_a_reset_stream_releases_its_reply(served: tuple[FullCore, int]) -> None:
    core, port = served
    with _held_client(port) as client:
        stream_id = _answered_and_held(client, core, np.ones(SIZE // 4, np.float32))
        assert core.released == 0
        client.reset(stream_id)
        _wait_released(core, 1)


def test_a_closed_connection_releases_its_reply(served: tuple[FullCore, int]) -> None:
    core, port = served
    client = _held_client(port)
    _answered_and_held(client, core, np.ones(SIZE // 4, np.float32))
    assert core.released == 0
    client.close()
    _wait_released(core, 1)


def test_past_the_lent_limit_replies_are_copied_and_released_at_once(
    served: tuple[FullCore, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    core, port = served
    monkeypatch.setattr(native_call, "LENT_LIMIT", SIZE + SIZE // 2)  # room for one reply
    data = np.ones(SIZE // 4, np.float32)
    with _held_client(port) as client:
        _answered_and_held(client, core, data)  # lent, held by the window
        client.start(grpc_frame(_request(data)))
        deadline = time.monotonic() + 10
        while core.issued < 2:
            assert time.monotonic() < deadline, "the second call was never answered"
            client.ping(b"answered")
        _wait_released(core, 1)  # the second reply is a copy: its memory went back at once
        client.ping(b"in sync!")
        assert core.released == 1  # the first still waits for the window
    _wait_released(core, 2)
