"""Request rescheduling: ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` sends a
request back to its scheduler (``sequence_batching { iterative_sequence: true }``), as Triton."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODELS = ("iterative_decoupled", "iterative_default", "reschedule_unsupported")


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args)) as srv:
        yield srv


def _in(module, value: int):
    inp = module.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [inp]


def test_decoupled_model_reschedules_until_done(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    for request in range(2):  # one after the other: the first sequence's slot is given back
        client.async_stream_infer("iterative_decoupled", _in(grpcclient, 4))
        got = []
        for _ in range(4):
            result, error = responses.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("OUT")[0]))
        assert got == [3, 2, 1, 0], (request, got)
    client.stop_stream()
    client.close()


def test_default_model_reschedules_and_answers_once(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    assert int(client.infer("iterative_default", _in(httpclient, 5)).as_numpy("RUNS")[0]) == 5
    # More requests than the model has sequence slots (one): each waits for a slot, which the
    # previous request's sequence gives back when it is done.
    pending = [client.async_infer("iterative_default", _in(httpclient, n)) for n in (1, 2, 3, 4)]
    runs = [int(p.get_result().as_numpy("RUNS")[0]) for p in pending]
    assert runs == [1, 2, 3, 4]
    client.close()


def test_response_for_a_rescheduled_request_is_an_error(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(
        InferenceServerException,
        match="Expected a None object in the execute function return list for reschduled request",
    ):
        client.infer("iterative_default", _in(httpclient, -1))
    client.close()


def test_rescheduling_needs_an_iterative_sequence(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(
        InferenceServerException,
        match="Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    ):
        client.infer("reschedule_unsupported", _in(httpclient, 2))
    client.close()
