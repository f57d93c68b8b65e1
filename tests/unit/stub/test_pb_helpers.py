"""The pure-Python helpers: dtype conversions, BYTES (de)serialization, lookups by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.ipc.dtypes import BytesFormatError
from shoal.stub import pb_utils
from tests.unit.stub.helpers import server_request

TRITON_TYPES = [
    (1, np.bool_),
    (2, np.uint8),
    (3, np.uint16),
    (4, np.uint32),
    (5, np.uint64),
    (6, np.int8),
    (7, np.int16),
    (8, np.int32),
    (9, np.int64),
    (10, np.float16),
    (11, np.float32),
    (12, np.float64),
    (13, np.object_),
]


@pytest.mark.parametrize(("value", "numpy_type"), TRITON_TYPES)
def test_triton_to_numpy_type(value, numpy_type):
    assert pb_utils.triton_to_numpy_type(value) is numpy_type


@pytest.mark.parametrize("value", [0, 14, 99])
def test_triton_to_numpy_type_unknown_and_bf16_is_none(value):
    assert pb_utils.triton_to_numpy_type(value) is None


@pytest.mark.parametrize(("value", "numpy_type"), TRITON_TYPES)
def test_numpy_to_triton_type(value, numpy_type):
    assert pb_utils.numpy_to_triton_type(numpy_type) == value
    assert pb_utils.numpy_to_triton_type(np.dtype(numpy_type)) == value


def test_numpy_to_triton_type_extra_spellings():
    assert pb_utils.numpy_to_triton_type(bool) == 1
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype("S8")) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype(">f4")) == 11


@pytest.mark.parametrize("numpy_type", [np.complex64, np.str_, "not a dtype", np.void])
def test_numpy_to_triton_type_unknown_is_none(numpy_type):
    assert pb_utils.numpy_to_triton_type(numpy_type) is None


@pytest.mark.parametrize(
    ("name", "numpy_type"),
    [
        ("TYPE_BOOL", bool),
        ("TYPE_UINT8", np.uint8),
        ("TYPE_UINT16", np.uint16),
        ("TYPE_UINT32", np.uint32),
        ("TYPE_UINT64", np.uint64),
        ("TYPE_INT8", np.int8),
        ("TYPE_INT16", np.int16),
        ("TYPE_INT32", np.int32),
        ("TYPE_INT64", np.int64),
        ("TYPE_FP16", np.float16),
        ("TYPE_FP32", np.float32),
        ("TYPE_FP64", np.float64),
        ("TYPE_STRING", np.object_),
    ],
)
def test_triton_string_to_numpy(name, numpy_type):
    assert pb_utils.triton_string_to_numpy(name) is numpy_type
    assert pb_utils.TRITON_STRING_TO_NUMPY[name] is numpy_type


def test_triton_string_to_numpy_has_exactly_tritons_keys():
    assert len(pb_utils.TRITON_STRING_TO_NUMPY) == 13
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


# -- BYTES helpers ---------------------------------------------------------------------------


def test_serialize_layout():
    array = np.array([b"ab", b"", b"xyz"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(array)
    assert isinstance(encoded, bytes)
    assert encoded == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"


def test_serialize_converts_non_bytes_objects():
    array = np.array([["é", 7]], dtype=np.object_)
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array))
    assert decoded.tolist() == ["é".encode(), b"7"]


def test_serialize_row_major_order():
    array = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=np.object_).T
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array))
    assert decoded.tolist() == [b"a", b"c", b"b", b"d"]


def test_serialize_bytes_dtype():
    array = np.array([b"ab", b"c"], dtype=np.bytes_)
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array))
    assert decoded.tolist() == [b"ab", b"c"]


@pytest.mark.parametrize(
    "array",
    [np.array([], dtype=np.object_), np.zeros((0, 3), dtype=np.object_), np.array([], np.float32)],
)
def test_serialize_empty_array_is_empty_tuple(array):
    assert pb_utils.serialize_byte_tensor(array) == ()


@pytest.mark.parametrize("array", [np.zeros(2, np.float32), np.array(["a"]), np.ones(1, bool)])
def test_serialize_other_dtypes_is_none(array):
    assert pb_utils.serialize_byte_tensor(array) is None


def test_deserialize_returns_a_1d_object_array():
    decoded = pb_utils.deserialize_bytes_tensor(b"\x01\x00\x00\x00a\x02\x00\x00\x00bc")
    assert decoded.dtype == np.object_
    assert decoded.shape == (2,)
    assert decoded.tolist() == [b"a", b"bc"]


def test_deserialize_empty_and_buffer_types():
    assert pb_utils.deserialize_bytes_tensor(b"").shape == (0,)
    data = b"\x01\x00\x00\x00z"
    assert pb_utils.deserialize_bytes_tensor(bytearray(data)).tolist() == [b"z"]
    assert pb_utils.deserialize_bytes_tensor(memoryview(data)).tolist() == [b"z"]
    assert pb_utils.deserialize_bytes_tensor(np.frombuffer(data, np.uint8)).tolist() == [b"z"]


@pytest.mark.parametrize("bad", [b"\x05\x00\x00\x00ab", b"\x01\x00", b"\x01\x00\x00\x00ab"])
def test_deserialize_malformed_raises(bad):
    with pytest.raises(BytesFormatError):
        pb_utils.deserialize_bytes_tensor(bad)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30))
def test_bytes_round_trip(items):
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    encoded = pb_utils.serialize_byte_tensor(array)
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == items


# -- lookups ---------------------------------------------------------------------------------


def test_get_input_tensor_by_name():
    request = server_request({"A": np.zeros(1), "B": np.ones(2)})
    assert pb_utils.get_input_tensor_by_name(request, "B").shape() == [2]
    assert pb_utils.get_input_tensor_by_name(request, "C") is None


def test_get_input_tensor_by_name_asks_other_objects_through_inputs():
    # A model's own test double (or a subclass) is read through ``inputs()``, as in Triton;
    # only the server's own requests are read from their list directly.
    tensor = pb_utils.Tensor("X", np.zeros(3, dtype=np.float32))

    class Double:
        def inputs(self):
            return [tensor]

    class Sub(pb_utils.InferenceRequest):
        def inputs(self):
            return [tensor]

    sub = Sub(inputs=[], requested_output_names=[], model_name="m")
    assert pb_utils.get_input_tensor_by_name(Double(), "X") is tensor
    assert pb_utils.get_input_tensor_by_name(sub, "X") is tensor


MODEL_CONFIG = {
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
}


def test_get_config_by_name():
    assert pb_utils.get_input_config_by_name(MODEL_CONFIG, "IN")["dims"] == [4]
    assert pb_utils.get_output_config_by_name(MODEL_CONFIG, "OUT")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(MODEL_CONFIG, "OUT") is None
    assert pb_utils.get_output_config_by_name({}, "OUT") is None


@pytest.mark.parametrize(
    ("model_config", "expected"),
    [
        ({}, False),
        ({"model_transaction_policy": {}}, False),
        ({"model_transaction_policy": {"decoupled": False}}, False),
        ({"model_transaction_policy": {"decoupled": True}}, True),
    ],
)
def test_using_decoupled_model_transaction_policy(model_config, expected):
    assert pb_utils.using_decoupled_model_transaction_policy(model_config) is expected
