"""InferenceRequest: the BLS constructor's checks and every accessor."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from shoal.stub import pb_utils
from shoal.stub.execute_checks import settle
from shoal.stub.pb_utils import InferenceRequest, Tensor, TritonModelException
from tests.unit.stub.helpers import server_request


def _tensor(name="IN"):
    return Tensor(name, np.zeros(2, dtype=np.float32))


def bls(**kwargs):
    kwargs.setdefault("inputs", [_tensor()])
    kwargs.setdefault("requested_output_names", ["OUT"])
    kwargs.setdefault("model_name", "target")
    return InferenceRequest(**kwargs)


def test_bls_defaults():
    request = bls()
    assert request.request_id() == ""
    assert request.correlation_id() == 0
    assert request.flags() == 0
    assert request.timeout() == 0
    assert request.parameters() == "{}"
    assert request.requested_output_names() == {"OUT"}
    assert request._model_name() == "target"
    assert request._model_version() == -1
    assert request._preferred_memory()._type() == pb_utils.MemoryType.DEFAULT
    assert request.trace().get_context() is None
    assert request.is_cancelled() is False


def test_bls_keywords_are_kept():
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    request = InferenceRequest(
        request_id="r",
        correlation_id="seq-7",
        inputs=[_tensor("A"), _tensor("B")],
        requested_output_names=["X", "Y"],
        model_name="m",
        model_version=3,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=5,
        preferred_memory=memory,
        parameters={"a": 1, "b": True, "c": "s"},
    )
    assert request.request_id() == "r"
    assert request.correlation_id() == "seq-7"
    assert [t.name() for t in request.inputs()] == ["A", "B"]
    assert request.requested_output_names() == {"X", "Y"}
    assert request._model_version() == 3
    assert request.flags() == 1
    assert request.timeout() == 5
    assert request._preferred_memory() is memory
    assert json.loads(request.parameters()) == {"a": 1, "b": True, "c": "s"}
    assert request._parameters_dict() == {"a": 1, "b": True, "c": "s"}


def test_positional_order_matches_triton():
    request = InferenceRequest("id", 4, [_tensor()], ["OUT"], "m", 2, 1, 10)
    assert (request.request_id(), request.correlation_id(), request.flags()) == ("id", 4, 1)
    assert (request._model_name(), request._model_version(), request.timeout()) == ("m", 2, 10)


@pytest.mark.parametrize("missing", ["inputs", "requested_output_names", "model_name"])
def test_required_arguments(missing):
    kwargs = {"inputs": [_tensor()], "requested_output_names": ["OUT"], "model_name": "m"}
    del kwargs[missing]
    with pytest.raises(TypeError, match=missing):
        InferenceRequest(**kwargs)


@pytest.mark.parametrize("correlation_id", [1.5, b"x", [1]])
def test_correlation_id_must_be_int_or_str(correlation_id):
    with pytest.raises(TritonModelException, match=r"^Correlation ID must be integer or string$"):
        bls(correlation_id=correlation_id)


def test_none_arguments_are_type_errors_as_in_triton():
    with pytest.raises(TypeError, match="correlation_id"):
        bls(correlation_id=None)
    with pytest.raises(TypeError, match="'OUT0'"):
        pb_utils.Tensor("OUT0", None)


def test_negative_correlation_id_raises():
    with pytest.raises(TritonModelException, match="Correlation ID"):
        bls(correlation_id=-1)


def test_none_input_raises():
    with pytest.raises(
        TritonModelException,
        match=r"^Input tensor for request with id 'r' and model name 'm' should not be empty\.$",
    ):
        InferenceRequest(request_id="r", inputs=[None], requested_output_names=[], model_name="m")


def test_inputs_none_is_a_type_error():
    with pytest.raises(TypeError):
        bls(inputs=None)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError):
        bls(inputs=[np.zeros(1)])


def test_empty_requested_output_name_raises():
    with pytest.raises(TritonModelException, match="should not be empty"):
        bls(requested_output_names=[""])


@pytest.mark.parametrize("value", [1.5, None, [1], {"a": 1}, b"x"])
def test_parameter_values_must_be_bool_int_str(value):
    with pytest.raises(
        TritonModelException, match=r"^Expect parameters values to have type bool/int/str"
    ):
        bls(parameters={"k": value})


def test_parameter_keys_must_be_str():
    with pytest.raises(TritonModelException, match="keys to have type str"):
        bls(parameters={1: "v"})


def test_parameters_must_be_a_dict():
    with pytest.raises(TritonModelException, match=r"^Expect .*, got <class 'list'>$"):
        bls(parameters=[("a", 1)])
    with pytest.raises(TritonModelException, match=r", got <class 'list'>$"):
        pb_utils.InferenceResponse(parameters=[])


def test_preferred_memory_and_trace_types_are_checked():
    with pytest.raises(TypeError):
        bls(preferred_memory="GPU")
    with pytest.raises(TypeError):
        bls(trace="ctx")
    trace = server_request().trace()
    assert bls(trace=trace).trace() is trace


def test_preferred_memory():
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
    assert memory._type() == pb_utils.TRITONSERVER_MEMORY_GPU
    assert memory._device() == 1
    assert pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)._device() == 0
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(5)
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, "0")


def test_flags_can_be_set():
    request = bls()
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert request.flags() == 2
    with pytest.raises(TypeError):
        request.set_flags("2")


def test_release_flags():
    request = server_request()
    assert request._release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request._release_flags() == 2
    with pytest.raises(TritonModelException):
        request.set_release_flags(7)


def test_server_request_accessors():
    request = server_request(
        {"IN": np.arange(3, dtype=np.int32)},
        requested=["OUT", "OUT2", "OUT"],
        parameters={"temperature": 0.5, "n": 2, "stream": True, "tag": "x"},
        request_id="abc",
        correlation_id=42,
        flags=3,
        timeout=1000,
    )
    assert request.request_id() == "abc"
    assert request.correlation_id() == 42
    assert request.flags() == 3
    assert request.timeout() == 1000
    names = request.requested_output_names()
    assert isinstance(names, set)
    assert names == {"OUT", "OUT2"}
    params = request.parameters()
    assert isinstance(params, str)
    assert json.loads(params) == {"temperature": 0.5, "n": 2, "stream": True, "tag": "x"}
    assert [t.name() for t in request.inputs()] == ["IN"]
    assert request._model_name() == "model"
    assert request._model_version() == 1


def test_inputs_returns_a_new_list():
    request = server_request({"IN": np.zeros(1)})
    request.inputs().clear()
    assert len(request.inputs()) == 1


def test_server_request_trace_context():
    request = pb_utils.InferenceRequest._from_server(
        request_id="",
        correlation_id=0,
        inputs=[],
        requested_output_names=[],
        flags=0,
        parameters={},
        timeout=0,
        model_name="m",
        model_version=1,
        deliver=None,
        decoupled=False,
        trace_context="trace-ctx",
    )
    assert request.trace().get_context() == "trace-ctx"


def test_cancellation_is_reported_once_marked():
    request = server_request(deliver=lambda response, flags: None)
    sender = request.get_response_sender()
    assert not request.is_cancelled()
    assert not sender.is_cancelled()
    request._mark_cancelled()
    assert request.is_cancelled()
    assert sender.is_cancelled()


def test_get_response_sender_is_cached():
    request = server_request(deliver=lambda response, flags: None)
    assert request.get_response_sender() is request.get_response_sender()
    assert isinstance(request.get_response_sender(), pb_utils.InferenceResponseSender)


@pytest.mark.parametrize("taken_before", [True, False])
def test_a_sender_taken_after_execute_returned_the_response_is_closed(taken_before):
    # The sender is made when first asked for: one asked for only after the runtime counted
    # the returned response behaves as one taken before (closed, its one response counted).
    sent = []
    request = server_request(deliver=lambda response, flags: sent.append(flags))
    if taken_before:
        request.get_response_sender()
    returned = pb_utils.InferenceResponse([])
    assert settle("m_0", returned, request, []) is returned
    assert not request._awaits_sender()
    sender = request.get_response_sender()
    with pytest.raises(TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse([]))
    with pytest.raises(TritonModelException, match="has been closed"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == []


def test_a_response_returned_after_one_sent_is_refused_as_a_second_send():
    request = server_request(deliver=lambda response, flags: None)
    request.get_response_sender().send(pb_utils.InferenceResponse([]))
    answer = settle("m_0", pb_utils.InferenceResponse([]), request, [])
    assert answer.has_error() and "cannot send more than one response" in answer.error().message()


# -- BLS -------------------------------------------------------------------------------------


def test_exec_without_executor_raises():
    with pytest.raises(
        TritonModelException, match=r"^BLS is only supported during the 'execute' function\.$"
    ):
        bls().exec()
    with pytest.raises(TritonModelException, match="BLS is only supported"):
        bls().async_exec()


class _Executor:
    def __init__(self):
        self.calls = []

    def exec(self, request, decoupled):
        self.calls.append(("exec", request, decoupled))
        return pb_utils.InferenceResponse([])

    def async_exec(self, request, decoupled):
        self.calls.append(("async_exec", request, decoupled))

        async def run():
            return pb_utils.InferenceResponse([])

        return run()


def test_exec_delegates_to_the_installed_executor():
    executor = _Executor()
    pb_utils._set_bls_executor(executor)
    request = bls()
    assert isinstance(request.exec(), pb_utils.InferenceResponse)
    request.exec(decoupled=True)
    assert executor.calls == [("exec", request, False), ("exec", request, True)]
    pb_utils._set_bls_executor(None)
    with pytest.raises(TritonModelException):
        request.exec()


def test_async_exec_delegates_to_the_installed_executor():
    executor = _Executor()
    pb_utils._set_bls_executor(executor)
    request = bls()

    async def main():
        return await request.async_exec(decoupled=True)

    assert isinstance(asyncio.run(main()), pb_utils.InferenceResponse)
    assert executor.calls == [("async_exec", request, True)]


def test_inference_trace():
    assert pb_utils.InferenceTrace("c").get_context() == "c"
    assert pb_utils.InferenceTrace().get_context() is None


def test_a_request_is_freed_by_reference_counting():
    import gc
    import weakref

    request = server_request({"IN": np.zeros(2)}, deliver=lambda response, flags: None)
    request.get_response_sender()
    ref = weakref.ref(request)
    gc.disable()
    try:
        del request
        assert ref() is None  # no reference cycle: input views are released promptly
    finally:
        gc.enable()
