"""GPU memory for ``pb_utils.Tensor``: cupy arrays behind DLPack, imported only when used.

A GPU tensor holds a cupy ndarray over the producer's device memory (``cupy.from_dlpack`` is
zero-copy), so ``to_dlpack`` and ``__dlpack__`` hand the same pointer on to torch or cupy. A stub
without cupy can still take CPU tensors; a GPU tensor then fails with a message that says what
to install.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.ipc.cuda import CudaUnavailable, cuda_device_count, cupy_module
from shoal.ipc.dtypes import numpy_to_datatype
from shoal.stub import _pb_dlpack as dlpack
from shoal.stub._pb_errors import TritonModelException


def cupy_or_raise(what: str) -> Any:
    """The cupy module when it sees a CUDA device, else TritonModelException naming ``what``."""
    try:
        cupy = cupy_module()
    except CudaUnavailable as error:
        raise TritonModelException(f"{what} needs a CUDA GPU: {error}") from None
    if cuda_device_count() == 0:
        raise TritonModelException(f"{what} needs a CUDA GPU: cupy sees no CUDA device")
    return cupy


def check_device(name: str, device: tuple[int, int]) -> None:
    """Refuse device memory shoal cannot hold before the producer is asked to export it."""
    if device[0] != dlpack.DEVICE_CUDA:
        raise TritonModelException(
            f"Tensor.from_dlpack('{name}'): {dlpack.device_name(device[0])} memory is not "
            "supported; only CPU and CUDA memory are"
        )
    cupy_or_raise(
        f"Tensor.from_dlpack('{name}'): the data is in CUDA memory (device {device[1]}), which"
    )


def import_device_capsule(name: str, capsule: object, device: tuple[int, int]) -> tuple[Any, bool]:
    """A cupy array over a CUDA DLPack capsule (no copy), and whether it holds bfloat16 (then
    as raw 16-bit words, which cupy has no dtype for either); the capsule is consumed."""
    check_device(name, device)
    cupy = cupy_module()
    bfloat16 = _holds_bfloat16(name, capsule)
    with cupy.cuda.Device(device[1]):
        array = cupy.from_dlpack(dlpack.CapsuleProducer(capsule, device))
    _check_contiguous(array)
    return array, bfloat16


def _holds_bfloat16(name: str, capsule: object) -> bool:
    """Whether the capsule holds bfloat16; TritonModelException when it cannot be imported."""
    try:
        return dlpack.check_importable(capsule)
    except dlpack.DLPackError as error:
        raise TritonModelException(f"Tensor.from_dlpack('{name}'): {error}") from None


def _check_contiguous(array: Any) -> None:
    if not array.flags.c_contiguous:
        raise TritonModelException(
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
            "in C-Order are supported."
        )


def datatype_of(array: Any, bfloat16: bool) -> str:
    if bfloat16:
        return "BF16"
    try:
        return numpy_to_datatype(np.dtype(array.dtype))
    except TypeError:
        raise TritonModelException("NumPy dtype is not supported.") from None


def device_of(array: Any) -> int:
    return int(array.device.id)


def to_host(array: Any) -> np.ndarray:
    """One device-to-host copy: a GPU tensor written where host bytes are needed (a client's
    system shared-memory region, or a BLS caller that prefers CPU memory)."""
    return np.ascontiguousarray(array.get())


def to_device(array: np.ndarray, device: int) -> Any:
    """One host-to-device copy onto ``device``."""
    cupy = cupy_or_raise("moving a tensor to the GPU")
    with cupy.cuda.Device(device):
        return cupy.asarray(array)
