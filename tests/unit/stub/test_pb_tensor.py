"""pb_utils.Tensor: construction rules, accessors and the runtime hooks."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import Tensor, TritonModelException
from tests.unit.stub.helpers import readonly

NUMERIC = [
    (np.bool_, "BOOL", 1),
    (np.uint8, "UINT8", 2),
    (np.uint16, "UINT16", 3),
    (np.uint32, "UINT32", 4),
    (np.uint64, "UINT64", 5),
    (np.int8, "INT8", 6),
    (np.int16, "INT16", 7),
    (np.int32, "INT32", 8),
    (np.int64, "INT64", 9),
    (np.float16, "FP16", 10),
    (np.float32, "FP32", 11),
    (np.float64, "FP64", 12),
]


@pytest.mark.parametrize(("numpy_type", "datatype", "value"), NUMERIC)
def test_numeric_dtypes(numpy_type, datatype, value):
    array = np.ones((2, 3), dtype=numpy_type)
    tensor = Tensor("t", array)
    assert tensor.name() == "t"
    assert tensor.shape() == [2, 3]
    assert all(type(dim) is int for dim in tensor.shape())
    assert tensor.is_cpu()
    assert tensor.triton_dtype() == value
    assert tensor._datatype() == datatype
    assert tensor.as_numpy() is array  # kept by reference, as in Triton
    assert tensor._array() is array


def test_empty_name_raises():
    with pytest.raises(TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        Tensor("", np.zeros(1))


def test_name_must_be_str():
    with pytest.raises(TypeError):
        Tensor(None, np.zeros(1))


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype="datetime64[s]"),
        np.zeros(2, dtype=[("a", "i4")]),
    ],
)
def test_unsupported_dtype_raises(array):
    with pytest.raises(TritonModelException, match=r"^NumPy dtype is not supported\.$"):
        Tensor("t", array)


def test_non_contiguous_array_is_made_contiguous():
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    view = base[:, ::2]
    tensor = Tensor("t", view)
    out = tensor.as_numpy()
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, view)


def test_big_endian_array_is_stored_little_endian():
    array = np.arange(3, dtype=">f4")
    tensor = Tensor("t", array)
    assert tensor._datatype() == "FP32"
    assert tensor._array().dtype == np.dtype("<f4")
    np.testing.assert_array_equal(tensor._array(), array)


def test_list_input_is_converted():
    assert Tensor("t", [1, 2, 3]).shape() == [3]


def test_scalar_array():
    tensor = Tensor("t", np.array(5, dtype=np.int64))
    assert tensor.shape() == []


def test_object_array_is_bytes():
    array = np.array([b"a", "b", 3], dtype=np.object_)
    tensor = Tensor("s", array)
    assert tensor._datatype() == "BYTES"
    assert tensor.triton_dtype() == 13
    assert tensor.as_numpy() is array
    assert tensor._array() is array


def test_bytes_array_gives_object_array_to_runtime():
    array = np.array([[b"ab", b"c\x00"]], dtype=np.bytes_)
    tensor = Tensor("s", array)
    assert tensor._datatype() == "BYTES"
    assert tensor.as_numpy() is array
    out = tensor._array()
    assert out.dtype == np.object_
    assert out.shape == (1, 2)
    assert out.tolist() == [[b"ab", b"c"]]  # trailing NULs of bytes_ are lost, as in Triton


def test_str_array_is_utf8_bytes():
    tensor = Tensor("s", np.array(["é", "x"]))
    assert tensor._datatype() == "BYTES"
    assert tensor._array().tolist() == ["é".encode(), b"x"]


def test_wrap_does_not_copy_or_validate():
    array = readonly(np.arange(4, dtype=np.float32))
    tensor = Tensor._wrap("in", array, "FP32")
    assert tensor.as_numpy() is array
    assert tensor._datatype() == "FP32"
    assert tensor.name() == "in"


def test_received_input_is_a_read_only_view():
    tensor = Tensor._wrap("in", readonly(np.zeros(3, dtype=np.float32)), "FP32")
    with pytest.raises(ValueError):
        tensor.as_numpy()[0] = 1.0
    copy = tensor.as_numpy().copy()
    copy[0] = 1.0  # the documented way: copy before writing


def test_bf16_as_numpy_raises():
    tensor = Tensor._wrap("b", np.zeros(2, dtype=np.uint16), "BF16")
    assert tensor.triton_dtype() == 14
    with pytest.raises(TritonModelException, match="BF16"):
        tensor.as_numpy()
    assert tensor._array().dtype == np.uint16


def test_repr_names_the_tensor():
    assert "FP32" in repr(Tensor("x", np.zeros(1, np.float32)))


def test_pb_utils_tensor_is_the_same_class():
    assert pb_utils.Tensor is Tensor
