"""A gRPC stream learns that a model was reloaded decoupled, with frontend workers and without
(``SHOAL_TEST_FRONTEND_WORKERS``): its answers are then written as they come, not held for the
order of the stream's requests (``frontends/grpc/servicer.py``, ``_KNOWN_SECS``)."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODEL = "maybe_decoupled"
#: The model's config, decoupled: the reload's.
DECOUPLED_CONFIG = json.dumps(
    {
        "name": MODEL,
        "backend": "python",
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "TICK", "data_type": "TYPE_INT32", "dims": [1]}],
    }
)


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ("--model-control-mode", "explicit", "--load-model", MODEL)
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _send(client: grpcclient.InferenceServerClient) -> None:
    data = grpcclient.InferInput("IN", [1], "INT32")
    data.set_data_from_numpy(np.array([1], dtype=np.int32))
    client.async_stream_infer(MODEL, [data])


def test_a_model_reloaded_decoupled_mid_stream_has_its_answers_written_as_they_come(
    server: ShoalServer,
):
    """The stream's first request finds the model not decoupled; the model is reloaded
    decoupled; the stream's next request ticks until cancelled: its ticks reach the client as
    they come. Before, the stream kept what it had learnt first and held them all for the
    request's end (here: never, until the stream is cancelled)."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        _send(client)
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("TICK")[0] == 0
        client.load_model(MODEL, config=DECOUPLED_CONFIG)
        assert client.get_model_config(MODEL).config.model_transaction_policy.decoupled
        time.sleep(1.5)  # what the stream knows of a model holds for 1 s (_KNOWN_SECS)
        _send(client)
        ticks = []
        while len(ticks) < 3:  # before the request ends: it ticks until the stream ends
            result, error = results.get(timeout=20)
            assert error is None, error
            ticks.append(int(result.as_numpy("TICK")[0]))
        assert ticks == [0, 1, 2]
        client.stop_stream(cancel_requests=True)
