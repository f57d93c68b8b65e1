"""Tensor DLPack interface: zero-copy round trips with NumPy (and torch when installed)."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from shoal.ipc.cuda import cuda_device_count
from shoal.stub.pb_utils import Tensor, TritonModelException
from tests.unit.stub.helpers import readonly

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_header(capsule):
    """(device_type, dtype code) fields of a legacy capsule's DLTensor, as ctypes ints."""
    address = _get_pointer(capsule, b"dltensor")
    # DLTensor: void* data; int32 device_type; int32 device_id; int32 ndim; uint8 code; ...
    device_type = ctypes.c_int32.from_address(address + 8)
    code = ctypes.c_uint8.from_address(address + 20)
    return device_type, code


def capsule_name(capsule) -> str:
    text = repr(capsule)
    return text.split('"')[1]


def test_to_dlpack_is_a_zero_copy_dltensor_capsule():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    capsule = Tensor("x", array).to_dlpack()
    assert capsule_name(capsule) == "dltensor"
    back = Tensor.from_dlpack("y", capsule)
    assert back.name() == "y"
    assert back.shape() == [2, 3]
    assert back._datatype() == "FP32"
    assert np.shares_memory(back.as_numpy(), array)
    assert capsule_name(capsule) == "used_dltensor"


def test_from_dlpack_on_numpy_array_is_zero_copy():
    array = np.arange(5, dtype=np.int64)
    tensor = Tensor.from_dlpack("x", array)
    assert tensor.triton_dtype() == 9
    assert np.shares_memory(tensor.as_numpy(), array)


def test_numpy_consumes_a_tensor_through_dunder_dlpack():
    tensor = Tensor("x", np.arange(4, dtype=np.uint8))
    assert tensor.__dlpack_device__() == (1, 0)
    out = np.from_dlpack(tensor)
    assert np.shares_memory(out, tensor.as_numpy())
    np.testing.assert_array_equal(out, [0, 1, 2, 3])


def test_dunder_dlpack_accepts_a_stream_argument():
    tensor = Tensor("x", np.arange(4, dtype=np.float32))
    assert capsule_name(tensor.__dlpack__(stream=None)) == "dltensor"
    assert capsule_name(tensor.__dlpack__(None)) == "dltensor"
    assert capsule_name(tensor.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"


def test_dunder_dlpack_rejects_another_device():
    with pytest.raises(BufferError):
        Tensor("x", np.zeros(2)).__dlpack__(dl_device=(2, 0))


def test_read_only_input_over_writable_memory_exports_without_copy():
    memory = mmap.mmap(-1, 16)
    array = readonly(np.frombuffer(memory, dtype=np.float32))
    tensor = Tensor._wrap("in", array, "FP32")
    back = Tensor.from_dlpack("x", tensor.to_dlpack())
    assert np.shares_memory(back.as_numpy(), array)
    versioned = np.from_dlpack(tensor)  # DLPack 1.0 keeps the read-only flag
    assert not versioned.flags.writeable
    assert np.shares_memory(versioned, array)


def test_read_only_immutable_memory_is_copied_for_a_legacy_capsule():
    array = np.frombuffer(b"\x00" * 8, dtype=np.float32)
    tensor = Tensor._wrap("in", array, "FP32")
    back = Tensor.from_dlpack("x", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert not np.shares_memory(back.as_numpy(), array)


@pytest.mark.parametrize(
    "numpy_type",
    [
        *(np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32),
        *(np.int64, np.float16, np.float32, np.float64),
    ],
)
def test_round_trip_every_dtype(numpy_type):
    array = np.ones((2, 2), dtype=numpy_type)
    tensor = Tensor.from_dlpack("x", Tensor("a", array).to_dlpack())
    assert tensor.as_numpy().dtype == array.dtype
    np.testing.assert_array_equal(tensor.as_numpy(), array)


def test_bf16_round_trip_keeps_the_dtype():
    words = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0 and 2.0 in bfloat16
    tensor = Tensor._wrap("b", words, "BF16")
    capsule = tensor.to_dlpack()
    _, code = _capsule_header(capsule)
    assert code.value == 4  # kDLBfloat
    back = Tensor.from_dlpack("c", capsule)
    assert back._datatype() == "BF16"
    assert back.triton_dtype() == 14
    np.testing.assert_array_equal(back._array(), words)
    assert np.shares_memory(back._array(), words)


def test_bf16_tensor_to_tensor_through_dunder_dlpack():
    words = np.array([0x3F80], dtype=np.uint16)
    back = Tensor.from_dlpack("c", Tensor._wrap("b", words, "BF16"))
    assert back._datatype() == "BF16"
    assert np.shares_memory(back._array(), words)


def test_legacy_capsule_import_is_writable_like_tritons():
    source = np.arange(3, dtype=np.int32)
    tensor = Tensor.from_dlpack("x", source.__dlpack__())
    out = tensor.as_numpy()
    assert out.flags.writeable
    out[0] = 7
    assert source[0] == 7  # the same memory: no copy was made


def test_bytes_tensor_has_no_dlpack():
    with pytest.raises(TritonModelException, match="BYTES"):
        Tensor("s", np.array([b"a"], dtype=np.object_)).to_dlpack()


def test_non_contiguous_source_raises():
    with pytest.raises(TritonModelException, match="DLPack tensor is not contiguous"):
        Tensor.from_dlpack("x", np.zeros((3, 4), dtype=np.float32)[:, ::2])


def test_size_one_dimensions_do_not_break_contiguity():
    array = np.zeros((3, 1), dtype=np.float32).T  # strides of a size-1 dim are ignored
    assert Tensor.from_dlpack("x", array).shape() == [1, 3]


def test_unsupported_dlpack_dtype_raises():
    with pytest.raises(TritonModelException, match="not supported"):
        Tensor.from_dlpack("x", np.zeros(2, dtype=np.complex64))


def test_consumed_capsule_raises():
    capsule = Tensor("x", np.zeros(2)).to_dlpack()
    Tensor.from_dlpack("a", capsule)
    with pytest.raises(TritonModelException, match="consumed"):
        Tensor.from_dlpack("b", capsule)


def test_from_dlpack_validates_name():
    with pytest.raises(TritonModelException, match="empty string"):
        Tensor.from_dlpack("", np.zeros(2))


def test_from_dlpack_rejects_other_objects():
    with pytest.raises(TritonModelException, match="__dlpack__"):
        Tensor.from_dlpack("x", [1, 2])


class _GpuProducer:
    def __init__(self):
        self.exported = False

    def __dlpack__(self, stream=None, **kwargs):
        self.exported = True
        raise AssertionError("a GPU producer must not be asked to export")

    def __dlpack_device__(self):
        return (2, 0)


# With a GPU these objects are accepted (tests/gpu covers that); without one they must be refused.
no_gpu = pytest.mark.skipif(cuda_device_count() > 0, reason="checks the behaviour without a GPU")


@no_gpu
def test_gpu_producer_is_refused_before_export():
    producer = _GpuProducer()
    with pytest.raises(TritonModelException, match="GPU"):
        Tensor.from_dlpack("x", producer)
    assert not producer.exported


@no_gpu
def test_gpu_capsule_is_refused():
    source = np.zeros(2, dtype=np.float32)
    capsule = source.__dlpack__()
    device_type, _ = _capsule_header(capsule)
    device_type.value = 2  # kDLCUDA
    with pytest.raises(TritonModelException, match="CUDA memory"):
        Tensor.from_dlpack("x", capsule)
    device_type.value = 1  # back to the CPU so the capsule's deleter sees a sane header


def test_cuda_host_memory_counts_as_cpu():
    source = np.arange(3, dtype=np.float32)
    capsule = source.__dlpack__()
    device_type, _ = _capsule_header(capsule)
    device_type.value = 3  # kDLCUDAHost: pinned host memory
    tensor = Tensor.from_dlpack("x", capsule)
    np.testing.assert_array_equal(tensor.as_numpy(), source)


class TestTorch:
    @pytest.fixture(autouse=True)
    def _torch(self):
        self.torch = pytest.importorskip("torch")

    def test_torch_tensor_round_trip(self):
        torch = self.torch
        source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        tensor = Tensor.from_dlpack("x", source)
        assert tensor.shape() == [2, 3]
        assert tensor._datatype() == "FP32"
        assert np.shares_memory(tensor.as_numpy(), source.numpy())
        back = torch.from_dlpack(tensor)
        assert back.data_ptr() == source.data_ptr()

    def test_torch_utils_capsule(self):
        torch = self.torch
        source = torch.ones(4, dtype=torch.int32)
        tensor = Tensor.from_dlpack("x", torch.utils.dlpack.to_dlpack(source))
        np.testing.assert_array_equal(tensor.as_numpy(), np.ones(4, dtype=np.int32))
        back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        assert back.data_ptr() == source.data_ptr()

    def test_torch_bfloat16(self):
        torch = self.torch
        source = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
        tensor = Tensor.from_dlpack("x", source)
        assert tensor._datatype() == "BF16"
        back = torch.from_dlpack(tensor)
        assert back.dtype == torch.bfloat16
        assert back.tolist() == [1.0, 2.0]
