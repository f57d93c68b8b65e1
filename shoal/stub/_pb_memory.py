"""BLS ``preferred_memory``: where the outputs of a BLS call are handed to the calling model.

BLS outputs arrive where the called model left them: in shared CPU memory, or as GPU tensors
over the CUDA pool. With ``PreferredMemory(TRITONSERVER_MEMORY_GPU, n)`` each CPU output is moved
to CUDA device ``n`` once (a host-to-device copy) and becomes a GPU tensor (``is_cpu()`` false,
``to_dlpack()`` a CUDA capsule); ``TRITONSERVER_MEMORY_CPU`` copies GPU outputs to the host. The
preference is a hint, as in Triton: where CUDA is not available the outputs stay on the CPU.
BYTES tensors always stay on the CPU.
"""

from __future__ import annotations

from shoal.ipc.cuda import cuda_device_count
from shoal.stub import _pb_gpu as gpu
from shoal.stub._pb_request import MemoryType, PreferredMemory
from shoal.stub._pb_response import InferenceResponse
from shoal.stub._pb_tensor import Tensor


def place_outputs(response: InferenceResponse, preferred: PreferredMemory) -> InferenceResponse:
    """``response`` with its outputs moved where ``preferred`` asks, when that is possible."""
    kind = preferred._type()
    if kind is MemoryType.DEFAULT or response.has_error():
        return response
    if kind is MemoryType.TRITONSERVER_MEMORY_GPU:
        if preferred._device() >= cuda_device_count():
            return response  # no such GPU here: a hint, not a requirement
        moved = [_to_gpu(tensor, preferred._device()) for tensor in response._outputs]
    else:
        moved = [_to_cpu(tensor) for tensor in response._outputs]
    response._outputs = moved
    return response


def _to_gpu(tensor: Tensor, device: int) -> Tensor:
    if not tensor.is_cpu() or tensor._datatype() == "BYTES":
        return tensor
    return Tensor._wrap_gpu(
        tensor.name(), gpu.to_device(tensor._array(), device), tensor._datatype()
    )


def _to_cpu(tensor: Tensor) -> Tensor:
    if tensor.is_cpu():
        return tensor
    return Tensor._wrap(tensor.name(), tensor._array(), tensor._datatype())
