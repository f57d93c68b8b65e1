"""Large gRPC inputs through frontend workers, which receive them straight into their input
arena (``shoal/frontends/grpc/native_split.py``): byte-exact with tritonclient whatever the
inputs' order and sizes, compressed calls, typed contents, calls reset mid-upload and frames
of odd sizes. Runs against ``--frontend-workers 2`` (and, where the suite runs with one
worker, the in-process frontend serves the same calls the old way)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hyperframe.frame import DataFrame, Frame, HeadersFrame, RstStreamFrame

from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, RawClient, grpc_frame, request_headers
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ("--frontend-workers", "2", "--model-control-mode", "explicit")
    args += ("--load-model", "identity", "--load-model", "slow_echo")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _port(server: ShoalServer) -> int:
    return int(server.grpc_url.rsplit(":", 1)[1])


def _echo_inputs(data: np.ndarray, large_first: bool) -> list[grpcclient.InferInput]:
    large = grpcclient.InferInput("IN", [data.size], "FP32")
    large.set_data_from_numpy(data)
    seconds = grpcclient.InferInput("SECONDS", [1], "FP32")
    seconds.set_data_from_numpy(np.zeros(1, np.float32))
    return [large, seconds] if large_first else [seconds, large]


@pytest.mark.parametrize("large_first", [True, False])
def test_a_large_and_a_small_input_in_either_order(server: ShoalServer, large_first: bool):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for size in (1 << 20, (16 << 10) + 3, 3 << 18):  # 4 MiB, 64 KiB + 12 B, 3 MiB
            data = np.random.default_rng(size).random(size, dtype=np.float32)
            result = client.infer("slow_echo", _echo_inputs(data, large_first))
            np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    finally:
        client.close()


def test_a_compressed_large_call(server: ShoalServer):
    data = np.random.default_rng(3).random(1 << 20, dtype=np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("IN_FP32", [data.size], "FP32")
        tensor.set_data_from_numpy(data)
        for algorithm in ("gzip", "deflate"):
            result = client.infer("identity", [tensor], compression_algorithm=algorithm)
            np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
    finally:
        client.close()


def _typed_request(data: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="IN_FP32", datatype="FP32", shape=[data.size])
    tensor.contents.fp32_contents.extend(data.tolist())
    return request.SerializeToString()


def _raw_request(data: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="identity")
    request.inputs.add(name="IN_FP32", datatype="FP32", shape=[data.size])
    request.raw_input_contents.append(data.tobytes())
    return request.SerializeToString()


def _output(body: bytes) -> np.ndarray:
    reply = pb.ModelInferResponse.FromString(body[5:])
    return np.frombuffer(reply.raw_output_contents[0], np.float32)


def test_large_typed_contents(server: ShoalServer):
    data = np.random.default_rng(5).random(1 << 16, dtype=np.float32)  # 256 KiB
    with H2Client(_port(server)) as client:
        response = client.call(grpc_frame(_typed_request(data)))
        assert response.status == "0", response.message
        np.testing.assert_array_equal(_output(response.data), data)


def test_a_call_reset_mid_upload_then_others_are_served(server: ShoalServer):
    data = np.random.default_rng(9).random(1 << 20, dtype=np.float32)
    body = grpc_frame(_raw_request(data))
    with H2Client(_port(server)) as client:
        # (That the blocks of reset calls go back is checked on the arena itself, in
        # tests/unit/frontends/grpc/test_native_receive.py.)
        for _ in range(8):
            stream_id = client.start(body[: len(body) // 2], end_stream=False)
            client.reset(stream_id)  # read by the server after the half it follows
        response = client.call(body)
        assert response.status == "0", response.message
        np.testing.assert_array_equal(_output(response.data), data)


@pytest.mark.parametrize("frame", [7, 16384, 65536 + 5, 1 << 20])
def test_frames_of_any_size(server: ShoalServer, frame: int):
    count = (50 << 10) + 1 if frame == 7 else (1 << 18) + 1  # 7-byte frames are many
    data = np.random.default_rng(frame).random(count, dtype=np.float32)
    body = grpc_frame(_raw_request(data))
    port = _port(server)
    with RawClient(port) as raw:
        block = raw.block(request_headers(port, INFER_PATH))
        raw.send(HeadersFrame(1, data=block, flags=["END_HEADERS"]))
        frames = [DataFrame(1, data=body[at : at + frame]) for at in range(0, len(body), frame)]
        frames[-1].flags.add("END_STREAM")
        for at in range(0, len(frames), 1024):
            raw.send(*frames[at : at + 1024])
        response = raw.read_stream(1)
    assert response.status == "0", response.message
    np.testing.assert_array_equal(_output(response.data), data)


def test_16k_frames_of_calls_interleaved_padded_and_reset(server: ShoalServer):
    """h2load's 16 KiB frames, read by runs straight into the blocks (frontends/h2/scatter.py):
    two calls' frames in turns of a few frames, a padded frame and a small one inside a run,
    a third call reset mid-upload between them; both answers byte-exact, and the connection
    serves the next call."""
    rng = np.random.default_rng(16)
    one, three, five = (
        rng.random(count, dtype=np.float32) for count in (1 << 18, 300_001, 1 << 17)
    )
    port = _port(server)

    def frames(stream_id: int, data: np.ndarray) -> list[DataFrame]:
        body = grpc_frame(_raw_request(data))
        out = [
            DataFrame(stream_id, data=body[at : at + 16384]) for at in range(0, len(body), 16384)
        ]
        out[-1].flags.add("END_STREAM")
        return out

    with RawClient(port) as raw:
        block = raw.block(request_headers(port, INFER_PATH))
        raw.send(*(HeadersFrame(i, data=block, flags=["END_HEADERS"]) for i in (1, 3, 5)))
        ones, threes, fives = frames(1, one), frames(3, three), frames(5, five)
        ones[20] = DataFrame(1, data=ones[20].data, pad_length=100, flags=["PADDED"])
        small = ones[30].data
        ones[30:31] = [DataFrame(1, data=small[:7]), DataFrame(1, data=small[7:])]
        wire: list[Frame] = []
        for turn in range(max(len(ones) // 7, len(threes) // 5) + 1):
            wire += ones[7 * turn : 7 * turn + 7] + threes[5 * turn : 5 * turn + 5]
            if turn == 2:
                wire += [*fives[:12], RstStreamFrame(5, error_code=8)]
        raw.send(*wire)
        others: list[Frame] = []
        for stream_id, data in ((1, one), (3, three)):
            response = raw.read_stream(stream_id, others)
            assert response.status == "0", response.message
            np.testing.assert_array_equal(_output(response.data), data)
        raw.send(HeadersFrame(7, data=block, flags=["END_HEADERS"]), *frames(7, five))
        response = raw.read_stream(7, others)
        assert response.status == "0", response.message
        np.testing.assert_array_equal(_output(response.data), five)
