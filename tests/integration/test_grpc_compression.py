"""``--grpc-infer-response-compression-level``: ModelInfer and ModelStreamInfer answers go
compressed with an algorithm the client accepts (grpc-core's rule, as Triton has it), and
tritonclient reads them. The wire is read with a plain HTTP/2 client (tests/h2client.py), which
sees the ``grpc-encoding`` header and each message's compressed flag that grpcio hides."""

from __future__ import annotations

import gzip
import queue
import struct
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, grpc_frame, identity_request, output_array
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
CONFIG_PATH = "/inference.GRPCInferenceService/ModelConfig"
#: What grpcio (and so tritonclient) sends.
ACCEPT_ALL = (("grpc-accept-encoding", "identity,deflate,gzip"),)
FLAGS = ("--model-control-mode=explicit", "--load-model=identity")


def _server(level: str, *extra: str) -> Iterator[ShoalServer]:
    args = (*FLAGS, f"--grpc-infer-response-compression-level={level}", *extra)
    with ShoalServer(BUNDLED, extra_args=args) as server:
        yield server


@pytest.fixture(scope="module")
def high() -> Iterator[ShoalServer]:
    yield from _server("high")


@pytest.fixture(scope="module")
def low() -> Iterator[ShoalServer]:
    yield from _server("LOW")  # in any case, as tritonserver reads it


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """Each message of a response body: its compressed flag and its bytes."""
    found, offset = [], 0
    while offset < len(data):
        flag, size = struct.unpack_from(">BI", data, offset)
        found.append((flag, bytes(data[offset + 5 : offset + 5 + size])))
        offset += 5 + size
    assert offset == len(data), "a truncated message"
    return found


def _inflate(encoding: str, payload: bytes) -> bytes:
    return gzip.decompress(payload) if encoding == "gzip" else zlib.decompress(payload)


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [("identity,deflate,gzip", "deflate"), ("gzip", "gzip"), ("identity, gzip", "gzip")],
)
def test_a_high_level_answer_takes_the_last_accepted_algorithm(
    high: ShoalServer, accept: str, encoding: str
) -> None:
    data = np.zeros(4096, np.uint8)
    with H2Client(high.grpc_port) as client:
        reply = client.call(
            grpc_frame(identity_request(data)), extra=(("grpc-accept-encoding", accept),)
        )
    assert reply.status == "0", (reply.status, reply.message)
    assert reply.headers.get("grpc-encoding") == encoding, reply.headers
    ((flag, payload),) = _messages(bytes(reply.data))
    assert flag == 1 and len(payload) < data.nbytes
    np.testing.assert_array_equal(output_array(_inflate(encoding, payload), np.uint8), data)


def test_a_low_level_answer_takes_the_first_accepted_algorithm(low: ShoalServer) -> None:
    data = np.arange(64, dtype=np.int32)
    with H2Client(low.grpc_port) as client:
        reply = client.call(grpc_frame(identity_request(data)), extra=ACCEPT_ALL)
    assert reply.headers.get("grpc-encoding") == "gzip", reply.headers
    ((flag, payload),) = _messages(bytes(reply.data))
    assert flag == 1
    np.testing.assert_array_equal(output_array(gzip.decompress(payload), np.int32), data)


def test_a_client_that_accepts_nothing_gets_plain_answers(high: ShoalServer) -> None:
    data = np.zeros(256, np.uint8)
    with H2Client(high.grpc_port) as client:
        plain = client.call(grpc_frame(identity_request(data)))
        refused = client.call(
            grpc_frame(identity_request(data)), extra=(("grpc-accept-encoding", "identity"),)
        )
    for reply in (plain, refused):
        assert "grpc-encoding" not in reply.headers, reply.headers
        ((flag, payload),) = _messages(bytes(reply.data))
        assert flag == 0
        np.testing.assert_array_equal(output_array(payload, np.uint8), data)


def test_stream_answers_are_compressed_and_other_methods_are_not(high: ShoalServer) -> None:
    data = np.zeros(1024, np.uint8)
    config = pb.ModelConfigRequest(name="identity").SerializeToString()
    with H2Client(high.grpc_port) as client:
        stream = client.call(
            grpc_frame(identity_request(data)) * 2, path=STREAM_PATH, extra=ACCEPT_ALL
        )
        other = client.call(grpc_frame(config), path=CONFIG_PATH, extra=ACCEPT_ALL)
    assert stream.headers.get("grpc-encoding") == "deflate", stream.headers
    answers = _messages(bytes(stream.data))
    assert len(answers) == 2 and all(flag == 1 for flag, _ in answers)
    for _, payload in answers:
        answer = pb.ModelStreamInferResponse.FromString(zlib.decompress(payload))
        assert not answer.error_message
        np.testing.assert_array_equal(
            np.frombuffer(answer.infer_response.raw_output_contents[0], np.uint8), data
        )
    assert "grpc-encoding" not in other.headers
    ((flag, payload),) = _messages(bytes(other.data))
    assert flag == 0 and pb.ModelConfigResponse.FromString(payload).config.name == "identity"


def _tritonclient_round_trip(url: str, data: np.ndarray) -> None:
    """A unary call and two stream calls with tritonclient, which must read the answers."""
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("IN_UINT8", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUT_UINT8"), data)
        answers: queue.Queue[object] = queue.Queue()
        client.start_stream(lambda result, error: answers.put(error or result))
        for _ in range(2):
            client.async_stream_infer("identity", [tensor])
        for _ in range(2):
            answer = answers.get(timeout=60)
            assert isinstance(answer, grpcclient.InferResult), answer
            np.testing.assert_array_equal(answer.as_numpy("OUT_UINT8"), data)
        client.stop_stream()
    finally:
        client.close()


@pytest.mark.parametrize("size", [100, 3 << 20])  # a large answer is deflated in a thread
def test_tritonclient_reads_compressed_answers(high: ShoalServer, size: int) -> None:
    data = (np.arange(size) % 7).astype(np.uint8)
    with H2Client(high.grpc_port) as client:  # the answer tritonclient gets is compressed
        reply = client.call(grpc_frame(identity_request(data)), extra=ACCEPT_ALL)
    ((flag, payload),) = _messages(bytes(reply.data))
    assert flag == 1 and len(payload) < size
    _tritonclient_round_trip(high.grpc_url, data)


def test_the_grpcio_server_compresses_too() -> None:
    for server in _server("medium", "--grpc-server=grpcio"):
        data = np.zeros(2048, np.uint8)
        with H2Client(server.grpc_port) as client:
            reply = client.call(grpc_frame(identity_request(data)), extra=ACCEPT_ALL)
        # grpc-core's medium of (gzip, deflate): the middle one, index 1.
        assert reply.headers.get("grpc-encoding") == "deflate", reply.headers
        ((flag, payload),) = _messages(bytes(reply.data))
        assert flag == 1
        np.testing.assert_array_equal(output_array(zlib.decompress(payload), np.uint8), data)
        _tritonclient_round_trip(server.grpc_url, data)
