"""A client that reads a decoupled stream but whose window stays shut for seconds at times (a
slow link, a busy application, window updates granted in large steps) gets every answer, with
frontend workers and without (``SHOAL_TEST_FRONTEND_WORKERS``).

The client here is HTTP/2 by hand (``tests/h2client.py``), so that the gap is the test's, not
the grpc library's: its stream's window stays shut for :data:`PAUSE` seconds while the model
sends thousands of answers more than the server's buffers hold, then it reads them all
(``core/backlog.py``). A client that stops reading is still cut (``test_attacks_workers.py``,
``test_stream_backlog.py``).
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Iterator

import pytest
from h2.settings import SettingCodes

from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import H2Client, grpc_frame
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(180)

STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
MODELS = ("decoupled_blob",)
#: Answers the model sends as fast as it can, of :data:`SIZE` bytes: more than the server's
#: buffers for the stream (the client's window, ~1 MiB of frames) hold by over 8,192
#: (``backlog.BACKLOG_MAX``) while the model still sends, fewer than
#: ``backlog.BACKLOG_HARD_MAX`` more than the client read.
COUNT = 30_000
SIZE = 1000
#: The client's stream window, and how long it stays shut before the client reads: its
#: application busy (a slow link, a pause), while the model sends on.
WINDOW = 1 << 20
PAUSE = 4.0


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args)) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _read_after_a_pause(client: H2Client, stream_id: int) -> list[int]:
    """The index of every answer of the stream: the window shut for :data:`PAUSE` seconds,
    then given back as the answers are read."""
    response = client.responses[stream_id]
    indexes: list[int] = []
    offset = read = 0
    opens_at = time.monotonic() + PAUSE
    while not response.done:
        if read and time.monotonic() >= opens_at:
            client.conn.increment_flow_control_window(read, stream_id=stream_id)
            client.flush()
            read = 0
        if not select.select([client.sock], [], [], max(0.0, opens_at - time.monotonic()))[0]:
            continue
        client.pump()
        data = response.data
        while len(data) - offset >= 5:
            size = struct.unpack_from(">I", data, offset + 1)[0]
            if len(data) - offset - 5 < size:
                break
            message = pb.ModelStreamInferResponse.FromString(data[offset + 5 : offset + 5 + size])
            assert not message.error_message, f"after {len(indexes)}: {message.error_message}"
            blob = message.infer_response.raw_output_contents[0]
            indexes.append(struct.unpack_from("<i", blob)[0])
            offset += 5 + size
            read += 5 + size
    assert response.status == "0", (response.status, response.message)
    return indexes


def _request() -> bytes:
    request = pb.ModelInferRequest(model_name="decoupled_blob")
    for name, value in (("COUNT", COUNT), ("SIZE", SIZE)):
        tensor = request.inputs.add(name=name, datatype="INT32")
        tensor.shape.append(1)
        request.raw_input_contents.append(struct.pack("<i", value))
    return request.SerializeToString()


def test_a_reader_whose_window_stays_shut_for_seconds_gets_every_answer(server: ShoalServer):
    """The model sends 30,000 answers of 1 kB as fast as it can; the client's window stays
    shut for 4 s, then it reads them all. Before, the stream was cut once 8,192 waited and the
    window had stayed shut for a second ("took none for 1 s")."""
    with H2Client(server.grpc_port, settings={SettingCodes.INITIAL_WINDOW_SIZE: WINDOW}) as client:
        client.ack = False  # the window is given back as the answers are read, not received
        client.conn.increment_flow_control_window(1 << 30)  # only the stream's window counts
        stream_id = client.start(grpc_frame(_request()), path=STREAM_PATH)
        indexes = _read_after_a_pause(client, stream_id)
    assert indexes == list(range(COUNT))
