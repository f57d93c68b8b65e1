"""TritonError codes and accessors; TritonModelException."""

from __future__ import annotations

import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import TritonError

CODES = {
    "UNKNOWN": 0,
    "INTERNAL": 1,
    "NOT_FOUND": 2,
    "INVALID_ARG": 3,
    "UNAVAILABLE": 4,
    "UNSUPPORTED": 5,
    "ALREADY_EXISTS": 6,
    "CANCELLED": 7,
}


@pytest.mark.parametrize(("name", "value"), sorted(CODES.items()))
def test_codes_have_tritonserver_error_code_values(name, value):
    code = getattr(TritonError, name)
    assert code == value
    assert code.name == name


def test_default_code_is_internal():
    error = TritonError("boom")
    assert error.message() == "boom"
    assert error.code() == TritonError.INTERNAL


def test_code_round_trips():
    error = TritonError("missing", TritonError.NOT_FOUND)
    assert error.code() is TritonError.NOT_FOUND
    assert error.code() == 2


def test_integer_code_is_accepted():
    assert TritonError("x", 3).code() is TritonError.INVALID_ARG


@pytest.mark.parametrize("code", [8, -1, "INTERNAL", 1.0, None, True])
def test_invalid_code_raises(code):
    with pytest.raises(TypeError):
        TritonError("x", code)


def test_message_must_be_str():
    with pytest.raises(TypeError):
        TritonError(42)


def test_codes_are_read_only():
    with pytest.raises(AttributeError):
        TritonError.INTERNAL = 5
    assert TritonError.INTERNAL == 1


def test_triton_error_is_a_value_not_an_exception():
    error = TritonError("not raised")
    assert not isinstance(error, BaseException)
    assert str(error) == "not raised"
    assert "NOT_FOUND" in repr(TritonError("x", TritonError.NOT_FOUND))


def test_model_exception_is_raisable_by_models():
    with pytest.raises(pb_utils.TritonModelException, match="mine"):
        raise pb_utils.TritonModelException("mine")


def test_error_code_name_for_the_runtime():
    ok = pb_utils.InferenceResponse([])
    assert ok._error_code_name() is None
    failed = pb_utils.InferenceResponse(error=TritonError("bad", TritonError.INVALID_ARG))
    assert failed._error_code_name() == "INVALID_ARG"
    assert pb_utils.InferenceResponse(error=TritonError("x"))._error_code_name() == "INTERNAL"
