"""ModelStreamInfer's ``triton_final_response`` as Triton 2.51 sends it (checked side by side):
on every response, True only on the last; an empty final response only when the client asks
for it and the model ended with the final flag alone. The order of a stream's answers."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit")
    args += ("--load-model", "decoupled_repeat", "--load-model", "add_sub", "--load-model", "slow")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args) as running:
        yield running


def _stream(server, model: str, inputs, expected: int, **options) -> list[tuple[object, bool]]:
    """``expected`` responses as (outputs, triton_final_response); then nothing more comes."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, **options)
        got = []
        for _ in range(expected):
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            outputs = result.as_numpy(response.outputs[0].name) if response.outputs else None
            got.append((outputs, response.parameters["triton_final_response"].bool_param))
        # The stream ends with the request: a request on it now is answered first, alone.
        client.async_stream_infer("add_sub", _add_sub_inputs())
        result, error = results.get(timeout=30)
        assert error is None and result.get_response().model_name == "add_sub"
    finally:
        client.stop_stream()
    return got


def _count(n: int) -> list:
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([n], np.int32))
    return [count]


def _add_sub_inputs() -> list:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        inputs.append(tensor)
    return inputs


def test_a_decoupled_models_responses_are_not_final_and_no_empty_one_unasked(server):
    got = _stream(server, "decoupled_repeat", _count(3), 3)
    assert [(out.tolist(), final) for out, final in got] == [
        ([0], False),
        ([1], False),
        ([2], False),
    ]


def test_an_empty_final_response_when_asked(server):
    got = _stream(server, "decoupled_repeat", _count(2), 3, enable_empty_final_response=True)
    assert [final for _, final in got] == [False, False, True]
    assert got[2][0] is None  # the empty one carries no outputs


def test_a_model_that_is_not_decoupled_answers_once_final(server):
    for flag in (False, True):
        got = _stream(server, "add_sub", _add_sub_inputs(), 1, enable_empty_final_response=flag)
        assert got[0][1] is True and got[0][0] is not None


def _seconds(value: float) -> list:
    seconds = grpcclient.InferInput("SECONDS", [1], "FP32")
    seconds.set_data_from_numpy(np.array([value], np.float32))
    return [seconds]


def test_answers_come_in_request_order_and_a_decoupled_models_as_they_come(server):
    # As Triton's stream writes them: the answer of a model that is not decoupled waits for
    # those of the requests sent before it (add_sub's for slow's); a decoupled model's
    # responses neither wait nor are waited for.
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("slow", _seconds(2.0), request_id="slow")
        client.async_stream_infer("add_sub", _add_sub_inputs(), request_id="quick")
        client.async_stream_infer("decoupled_repeat", _count(2), request_id="decoupled")
        got = []
        for _ in range(4):
            result, error = results.get(timeout=30)
            assert error is None, error
            got.append(result.get_response().id)
    finally:
        client.stop_stream()
    assert got == ["decoupled", "decoupled", "slow", "quick"]
