"""A decoupled model's responses reach the client (and a BLS caller) as Triton delivers them:
an error response is one response among the others, and the response sent with FINAL is the
last one a BLS iterator yields."""

from __future__ import annotations

import json
import queue
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

DECOUPLED_CONFIG = """
name: "{name}"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

PLAIN_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

# IN 0: data 1, an error, data 2, then FINAL alone. IN 1: data 1, then data 2 with FINAL.
SENDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _data(value):
    out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
    return pb_utils.InferenceResponse([out])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            sender.send(_data(1))
            if mode == 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("midway")))
                sender.send(_data(2))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(_data(2), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Calls "sender" with exec(decoupled=True) and reports what its iterator yielded.
CALLER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _describe(response):
    if response.has_error():
        return "error:" + response.error().message()
    outputs = response.output_tensors()
    if not outputs:
        return "empty"
    return int(outputs[0].as_numpy()[0])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="sender",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            )
            seen = [_describe(r) for r in call.exec(decoupled=True)]
            out = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""


def _write(repo: Path, name: str, config: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config.format(name=name))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled_responses")
    _write(repo, "sender", DECOUPLED_CONFIG, SENDER)
    _write(repo, "caller", PLAIN_CONFIG, CALLER)
    with ShoalServer(repo) as running:
        yield running


def _mode(module, value: int) -> list:
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return [tensor]


def _stream(server, mode: int, expected: int) -> list[tuple[object, bool]]:
    """``expected`` stream responses as (OUT value or error text, triton_final_response)."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: list[tuple[object, bool]] = []
    try:
        client.async_stream_infer(
            "sender", _mode(grpcclient, mode), enable_empty_final_response=True
        )
        for _ in range(expected):
            result, error = results.get(timeout=30)
            if error is not None:
                got.append((str(error), None))
                continue
            response = result.get_response()
            value = int(result.as_numpy("OUT")[0]) if response.outputs else None
            got.append((value, response.parameters["triton_final_response"].bool_param))
        with pytest.raises(queue.Empty):
            results.get(timeout=0.5)  # nothing more than expected
    finally:
        client.stop_stream()
    return got


def test_responses_after_an_error_response_still_reach_the_client(server):
    got = _stream(server, 0, 4)
    assert got[0] == (1, False)
    assert "midway" in str(got[1][0])
    assert got[2] == (2, False)
    assert got[3] == (None, True)  # the flags-only FINAL, asked for


def test_a_response_sent_with_final_is_the_streams_last(server):
    assert _stream(server, 1, 2) == [(1, False), (2, True)]


def _bls(server, mode: int) -> list:
    client = httpclient.InferenceServerClient(server.url)
    try:
        result = client.infer("caller", _mode(httpclient, mode))
        return json.loads(result.as_numpy("OUT")[0])
    finally:
        client.close()


def test_a_bls_iterator_yields_the_error_response_and_goes_on(server):
    assert _bls(server, 0) == [1, "error:midway", 2, "empty"]


def test_a_bls_iterator_ends_with_the_response_that_carried_final(server):
    assert _bls(server, 1) == [1, 2]


# Calls the plain model "caller" both ways: exec(decoupled=True) takes a model that is not
# decoupled (its one response comes with FINAL), as in Triton.
DECOUPLED_CALL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="caller",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            )
            seen = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    seen.append("error:" + response.error().message())
                else:
                    seen.append(json.loads(response.output_tensors()[0].as_numpy()[0]))
            wrong = pb_utils.InferenceRequest(
                model_name="sender",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            ).exec()
            seen.append(wrong.error().message() if wrong.has_error() else "no error")
            out = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""


def test_exec_decoupled_on_a_model_that_is_not_decoupled_yields_its_one_response(tmp_path):
    _write(tmp_path, "sender", DECOUPLED_CONFIG, SENDER)
    _write(tmp_path, "caller", PLAIN_CONFIG, CALLER)
    _write(tmp_path, "outer", PLAIN_CONFIG, DECOUPLED_CALL)
    with ShoalServer(tmp_path) as running:
        client = httpclient.InferenceServerClient(running.url)
        seen = json.loads(client.infer("outer", _mode(httpclient, 1)).as_numpy("OUT")[0])
        client.close()
    assert len(seen) == 2  # one response from the iterator, then the refused call's error
    assert seen[0] == [1, 2]  # caller's response: what its own decoupled call saw
    assert seen[1].startswith("Model sender is using the decoupled."), seen[1]


RAISE_AFTER_FINAL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            out = pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        raise RuntimeError("raised after the final response")
"""


def test_an_exception_after_the_final_response_is_logged(tmp_path):
    _write(tmp_path, "late_raise", DECOUPLED_CONFIG, RAISE_AFTER_FINAL)
    with ShoalServer(tmp_path) as running:
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(running.grpc_url)
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("late_raise", _mode(grpcclient, 0))
        result, error = results.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == 7
        client.stop_stream()
        client.close()
        running.stop()
        log = running.output
    assert "RuntimeError: raised after the final response" in log, log


DELAYED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            time.sleep(1.0)
            out = pb_utils.Tensor("OUT", np.array([5], dtype=np.int32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""

# While one coroutine awaits a decoupled async_exec, the model's event loop runs the others:
# the call resolves once the first response is there, so iterating it does not block the loop.
ASYNC_CALLER = """
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        events = []

        async def call():
            request = pb_utils.InferenceRequest(
                model_name="delayed",
                inputs=[pb_utils.Tensor("IN", np.array([0], dtype=np.int32))],
                requested_output_names=["OUT"],
            )
            responses = await request.async_exec(decoupled=True)
            for response in responses:
                events.append(int(response.output_tensors()[0].as_numpy()[0]))

        async def other():
            await asyncio.sleep(0.2)
            events.append("other")

        await asyncio.gather(call(), other())
        out = np.array([json.dumps(events).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


def test_a_decoupled_async_exec_resolves_with_its_first_response(tmp_path):
    _write(tmp_path, "delayed", DECOUPLED_CONFIG, DELAYED)
    _write(tmp_path, "async_caller", PLAIN_CONFIG, ASYNC_CALLER)
    with ShoalServer(tmp_path) as running:
        client = httpclient.InferenceServerClient(running.url)
        result = client.infer("async_caller", _mode(httpclient, 0))
        client.close()
    assert json.loads(result.as_numpy("OUT")[0]) == ["other", 5]


# IN 1: ignores cancellation (sends 5 responses whatever happens); IN 0: honours it with a
# CANCELLED error response. Each response's OUT says whether it saw the request cancelled.
STUBBORN = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            ignore = bool(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            for index in range(5):
                if index == 2:  # the caller cancels after two responses: wait until it has
                    deadline = time.monotonic() + 20
                    while not request.is_cancelled() and time.monotonic() < deadline:
                        time.sleep(0.01)
                if request.is_cancelled() and not ignore:
                    error = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
                    sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                    break
                seen = np.array([int(request.is_cancelled())], dtype=np.int32)
                sender.send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seen)]),
                    flags=final if index == 4 else 0,
                )
        return None
"""

CANCELLING = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        results = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="stubborn",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
            )
            responses = call.exec(decoupled=True)
            seen = []
            for response in responses:
                if response.has_error():
                    seen.append(pb_utils.TritonError.CANCELLED == response.error().code())
                    continue
                seen.append(int(response.output_tensors()[0].as_numpy()[0]))
                if len(seen) == 2:
                    responses.cancel()
            out = np.array([json.dumps(seen).encode()], dtype=np.object_)
            results.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return results
"""


def test_response_iterator_cancel_lets_the_called_model_decide(tmp_path):
    _write(tmp_path, "stubborn", DECOUPLED_CONFIG, STUBBORN)
    _write(tmp_path, "cancelling", PLAIN_CONFIG, CANCELLING)
    with ShoalServer(tmp_path) as running:
        client = httpclient.InferenceServerClient(running.url)
        try:
            ignored = client.infer("cancelling", _mode(httpclient, 1)).as_numpy("OUT")[0]
            honoured = client.infer("cancelling", _mode(httpclient, 0)).as_numpy("OUT")[0]
        finally:
            client.close()
    # Ignored: every response still arrives, the later ones sent after the cancel.
    assert json.loads(ignored) == [0, 0, 1, 1, 1]
    # Honoured: the model's own CANCELLED error response ends the iteration.
    assert json.loads(honoured) == [0, 0, True]


def test_triton_grpc_error_metadata_ends_the_stream_with_the_errors_status(server):
    """With ``triton_grpc_error: true`` (Triton's stream metadata) the first error ends the
    stream with its gRPC status; nothing after it arrives."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(
        callback=lambda result, error: results.put((result, error)),
        headers={"triton_grpc_error": "true"},
    )
    try:
        client.async_stream_infer("sender", _mode(grpcclient, 0))
        result, error = results.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == 1
        result, error = results.get(timeout=30)
        assert error is not None, result
        assert str(error.status()) == "StatusCode.INTERNAL"
        assert "midway" in error.message()
        with pytest.raises(queue.Empty):
            results.get(timeout=1.0)  # the stream is closed: no more data, no FINAL
    finally:
        client.stop_stream()
        client.close()
