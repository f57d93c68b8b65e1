"""InferenceResponse and ResponseIterator."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import InferenceResponse, Tensor, TritonError, TritonModelException


def test_defaults():
    response = InferenceResponse()
    assert response.output_tensors() == []
    assert not response.has_error()
    assert response.error() is None
    assert response.parameters() == "{}"


def test_outputs_and_positional_arguments():
    out = Tensor("OUT", np.zeros(2))
    response = InferenceResponse([out])
    assert response.output_tensors() == [out]
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "NOPE") is None


def test_error_response():
    error = TritonError("bad input", TritonError.INVALID_ARG)
    response = InferenceResponse(output_tensors=[], error=error)
    assert response.has_error()
    assert response.error() is error
    assert response._error_code_name() == "INVALID_ARG"


def test_parameters_are_json():
    response = InferenceResponse([], parameters={"a": 1, "b": "x", "c": False})
    text = response.parameters()
    assert isinstance(text, str)
    assert json.loads(text) == {"a": 1, "b": "x", "c": False}
    assert response._parameters_dict() == {"a": 1, "b": "x", "c": False}


def test_parameter_rules():
    with pytest.raises(TritonModelException, match="bool/int/str"):
        InferenceResponse([], parameters={"a": 1.5})
    with pytest.raises(TritonModelException, match="keys to have type str"):
        InferenceResponse([], parameters={2: 1})


def test_output_tensors_none_is_a_type_error():
    with pytest.raises(TypeError):
        InferenceResponse(output_tensors=None)


def test_none_output_raises_model_exception():
    with pytest.raises(TritonModelException):
        InferenceResponse([None])


def test_wrong_types():
    with pytest.raises(TypeError):
        InferenceResponse([np.zeros(1)])
    with pytest.raises(TypeError):
        InferenceResponse([], error="boom")


def test_from_parts_accepts_server_parameters():
    response = InferenceResponse._from_parts([], None, {"score": 0.25})
    assert json.loads(response.parameters()) == {"score": 0.25}


def test_response_iterator_stops_after_final_and_replays():
    iterator = pb_utils.ResponseIterator()
    first, second = InferenceResponse(), InferenceResponse()
    iterator._push(first, False)
    iterator._push(second, False)
    iterator._push(None, True)
    seen = list(iterator)
    assert seen[:2] == [first, second]
    assert len(seen) == 3
    assert seen[2].output_tensors() == []
    assert list(iterator) == seen  # a second pass replays


def test_response_iterator_waits_for_responses():
    iterator = pb_utils.ResponseIterator()
    response = InferenceResponse()

    def produce():
        iterator._push(response, True)

    thread = threading.Thread(target=produce)
    thread.start()
    assert next(iterator) is response
    thread.join()
    with pytest.raises(StopIteration):
        next(iterator)


def test_response_iterator_cancel():
    cancelled = []
    pb_utils.ResponseIterator(cancel=lambda: cancelled.append(True)).cancel()
    assert cancelled == [True]
    pb_utils.ResponseIterator().cancel()  # no-op without a callback
