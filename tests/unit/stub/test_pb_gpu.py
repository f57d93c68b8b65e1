"""GPU tensors and BLS ``preferred_memory`` on a machine without CUDA.

What runs here: the refusals and fallbacks without cupy or a GPU, and the GPU tensor's own
methods over a stand-in for a cupy array (only the attributes the Tensor reads). Real device
memory is exercised in tests/gpu/.
"""

from __future__ import annotations

import numpy as np
import pytest

from shoal.ipc.cuda import cuda_device_count
from shoal.stub import pb_utils
from shoal.stub._pb_memory import place_outputs
from shoal.stub.pb_utils import InferenceResponse, PreferredMemory, Tensor, TritonModelException

no_gpu = pytest.mark.skipif(cuda_device_count() > 0, reason="checks the behaviour without a GPU")


class DeviceArrayStandIn:
    """The part of a cupy ndarray that a GPU Tensor reads: shape, device, get()."""

    class _Device:
        id = 1

    def __init__(self, host: np.ndarray) -> None:
        self._host = host
        self.shape = host.shape
        self.dtype = host.dtype
        self.device = self._Device()

    def get(self) -> np.ndarray:
        return self._host.copy()


def gpu_tensor() -> Tensor:
    return Tensor._wrap_gpu("OUT", DeviceArrayStandIn(np.arange(6, dtype=np.float32)), "FP32")


def test_a_gpu_tensor_says_where_it_is() -> None:
    tensor = gpu_tensor()
    assert not tensor.is_cpu()
    assert tensor.shape() == [6]
    assert tensor.__dlpack_device__() == (2, 1)
    assert tensor.triton_dtype() == 11


def test_a_gpu_tensor_refuses_numpy_with_tritons_message() -> None:
    with pytest.raises(
        TritonModelException, match="Tensor is stored in GPU and cannot be converted"
    ):
        gpu_tensor().as_numpy()


def test_a_gpu_output_is_copied_to_the_host_once_for_the_response() -> None:
    np.testing.assert_array_equal(gpu_tensor()._array(), np.arange(6, dtype=np.float32))


@no_gpu
def test_a_cuda_capsule_needs_cupy_or_a_gpu() -> None:
    class CudaProducer:
        def __dlpack__(self, stream=None, **kwargs):
            raise AssertionError("must be refused before it exports")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(
        TritonModelException, match=r"CUDA memory \(device 0\), which needs a CUDA GPU"
    ):
        Tensor.from_dlpack("x", CudaProducer())


def test_rocm_memory_is_refused_by_name() -> None:
    class RocmProducer:
        def __dlpack__(self, stream=None, **kwargs):
            raise AssertionError("must be refused before it exports")

        def __dlpack_device__(self):
            return (10, 0)

    with pytest.raises(TritonModelException, match="ROCM memory is not supported"):
        Tensor.from_dlpack("x", RocmProducer())


def _response() -> InferenceResponse:
    outputs = [
        Tensor("A", np.arange(3, dtype=np.float32)),
        Tensor("S", np.array([b"x"], dtype=np.object_)),
    ]
    return InferenceResponse._from_parts(outputs, None, {})


def test_no_preference_leaves_bls_outputs_alone() -> None:
    response = _response()
    before = response.output_tensors()
    placed = place_outputs(response, PreferredMemory._default())
    assert [t is b for t, b in zip(placed.output_tensors(), before, strict=True)] == [True, True]


@no_gpu
def test_a_gpu_preference_without_a_gpu_keeps_outputs_on_the_cpu() -> None:
    memory = PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
    placed = place_outputs(_response(), memory)
    assert all(tensor.is_cpu() for tensor in placed.output_tensors())
    np.testing.assert_array_equal(placed.output_tensors()[0].as_numpy(), np.arange(3))


def test_a_cpu_preference_brings_gpu_outputs_to_the_host() -> None:
    response = InferenceResponse._from_parts([gpu_tensor()], None, {})
    placed = place_outputs(response, PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
    [tensor] = placed.output_tensors()
    assert tensor.is_cpu()
    np.testing.assert_array_equal(tensor.as_numpy(), np.arange(6, dtype=np.float32))


def test_an_error_response_is_not_touched() -> None:
    response = InferenceResponse(error=pb_utils.TritonError("failed"))
    assert place_outputs(response, PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)) is response
