"""Frames on a stream whose client side has ended (half-closed, remote): DATA or a header block
there is a stream error of type STREAM_CLOSED (RFC 9113 section 5.1). The stream is reset, its
call cancelled as by the client's own reset, and the connection serves on, its HPACK state
kept (the block is decoded all the same). The server, its connection and the client's frames
are real; the core is the frontend tests' double."""

from __future__ import annotations

import pytest
from hyperframe.frame import DataFrame, Frame, HeadersFrame

from shoal.protos import grpc_service_pb2 as pb
from tests.h2client import RawClient, grpc_frame, request_headers
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_native import _settled, echo_request, gated_call

pytestmark = pytest.mark.timeout(30)

STREAM_CLOSED = 0x5
EXTRA = (("x-extra", "1"),)  # indexed by the client's HPACK encoder: its next block refers to it


def _after_the_end(raw: RawClient, kind: str) -> Frame:
    if kind == "data":
        return DataFrame(1, data=grpc_frame(echo_request(16)), flags=["END_STREAM"])
    trailers = raw.block(list(EXTRA))
    return HeadersFrame(1, data=trailers, flags=["END_HEADERS", "END_STREAM"])


@pytest.mark.parametrize("kind", ["headers", "data"])
def test_a_frame_after_the_end_of_a_request_resets_its_stream(
    loop_thread: LoopThread, kind: str
) -> None:
    """A ModelInfer call whose request has ended and that waits on the core: a header block
    (trailers again) or DATA on its stream resets the stream with STREAM_CLOSED; the core's
    wait is cancelled and the call leaves the running calls; the next call on the connection
    is served, its header block decoded with the table the ignored block updated."""
    with gated_call(loop_thread) as (server, core, raw):
        raw.send(_after_the_end(raw, kind))
        response = raw.read_stream(1)
        assert response.reset == STREAM_CLOSED, response
        assert not response.headers  # no status: the stream was reset, not answered
        assert loop_thread.run(_settled(core, server)) == (1, 0)
        port = raw.port
        raw.send(
            HeadersFrame(
                3, data=raw.block(request_headers(port, extra=EXTRA)), flags=["END_HEADERS"]
            ),
            DataFrame(3, data=grpc_frame(echo_request(16)), flags=["END_STREAM"]),
        )
        served = raw.read_stream(3)
        assert served.status == "0", (served.status, served.message)
        (reply,) = served.messages()
        assert len(pb.ModelInferResponse.FromString(reply).raw_output_contents[0]) == 16
