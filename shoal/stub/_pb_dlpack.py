"""DLPack capsules: read and patch the ``DLTensor`` header, import and export through NumPy.

NumPy does the real work (``ndarray.__dlpack__`` and ``np.from_dlpack``, both zero-copy). This
module adds what NumPy lacks for ``pb_utils.Tensor``: accepting a raw ``"dltensor"`` capsule (as
``torch.utils.dlpack.to_dlpack`` returns), refusing device memory before it is touched, and
carrying bfloat16, which NumPy has no dtype for, as raw 16-bit words.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import numpy as np

LEGACY = "dltensor"
VERSIONED = "dltensor_versioned"

# DLDeviceType values.
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3
_HOST_DEVICES = frozenset({DEVICE_CPU, DEVICE_CUDA_HOST, 11})  # 11: kDLROCMHost
_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 10: "ROCM", 11: "ROCMHost", 13: "CUDAManaged"}

# DLDataTypeCode values.
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_SUPPORTED_BITS = {_INT: (8, 16, 32, 64), _UINT: (8, 16, 32, 64), _FLOAT: (16, 32, 64), _BOOL: (8,)}


class DLPackError(ValueError):
    """A capsule or DLPack producer that ``Tensor.from_dlpack`` cannot take; carries the reason."""


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]


def is_capsule(obj: object) -> bool:
    """Whether ``obj`` is a ``PyCapsule`` (of any name)."""
    return type(obj).__name__ == "PyCapsule"


def capsule_name(capsule: object) -> str:
    """The capsule's name (``""`` for an unnamed one)."""
    name = _capsule_get_name(capsule)
    return "" if name is None else name.decode("ascii", "replace")


def _dltensor(capsule: object) -> _DLTensor:
    """The ``DLTensor`` header inside an unconsumed DLPack capsule (a live view, not a copy)."""
    name = capsule_name(capsule)
    if name == LEGACY:
        # DLManagedTensor starts with its DLTensor.
        return _DLTensor.from_address(_capsule_get_pointer(capsule, b"dltensor"))
    if name == VERSIONED:
        address = _capsule_get_pointer(capsule, b"dltensor_versioned")
        return _DLManagedTensorVersioned.from_address(address).dl_tensor  # type: ignore[no-any-return]
    if name.startswith("used_"):
        raise DLPackError("the DLPack capsule has already been consumed")
    raise DLPackError(f"expected a 'dltensor' capsule, got a capsule named {name!r}")


def capsule_device(capsule: object) -> tuple[int, int]:
    """``(device_type, device_id)`` of a DLPack capsule."""
    device = _dltensor(capsule).device
    return int(device.device_type), int(device.device_id)


def device_name(device_type: int) -> str:
    """A readable name of a DLPack device type."""
    return _DEVICE_NAMES.get(device_type, f"device type {device_type}")


def is_host_device(device_type: int) -> bool:
    """Whether NumPy can address the memory of this device type directly."""
    return device_type in _HOST_DEVICES


def check_importable(capsule: object) -> bool:
    """Validate the capsule's dtype for a Tensor; return whether it holds bfloat16.

    A bfloat16 capsule is relabelled as uint16 in place so that NumPy imports the raw words; the
    caller owns the capsule at this point, and the producer's deleter does not read the dtype.
    """
    dtype = _dltensor(capsule).dtype
    code, bits, lanes = int(dtype.code), int(dtype.bits), int(dtype.lanes)
    if lanes != 1:
        raise DLPackError(f"DLPack tensors with {lanes} lanes are not supported")
    if code == _BFLOAT and bits == 16:
        dtype.code = _UINT
        return True
    if bits not in _SUPPORTED_BITS.get(code, ()):
        raise DLPackError(f"DLPack dtype (code {code}, {bits} bits) is not supported")
    return False


def mark_bfloat16(capsule: object) -> None:
    """Relabel an exported 16-bit unsigned capsule as bfloat16 (for BF16 tensors)."""
    dtype = _dltensor(capsule).dtype
    dtype.code = _BFLOAT


class CapsuleProducer:
    """Presents a bare capsule to ``np.from_dlpack`` (or ``cupy.from_dlpack``), which only take
    producer objects."""

    __slots__ = ("_capsule", "_device")

    def __init__(self, capsule: object, device: tuple[int, int]) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, stream: object = None, **kwargs: object) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _numpy_import(producer: CapsuleProducer) -> np.ndarray:
    try:
        return np.from_dlpack(cast(Any, producer))
    except (BufferError, RuntimeError, TypeError) as error:
        raise DLPackError(f"NumPy cannot import the DLPack tensor: {error}") from error


def import_capsule(capsule: object) -> np.ndarray:
    """Zero-copy NumPy array over a host-memory capsule; the capsule is consumed.

    NumPy marks arrays imported from a legacy ``"dltensor"`` capsule read-only because that
    protocol cannot say whether writing is allowed. Legacy producers (``torch.utils.dlpack``)
    lend writable memory, so such arrays are re-exposed writable, as Triton's are.
    """
    legacy = capsule_name(capsule) == LEGACY
    producer = CapsuleProducer(capsule, capsule_device(capsule))
    array = _numpy_import(producer)
    if legacy and not array.flags.writeable:
        array = _writable_alias(array)
    return array


class _InterfaceKeeper:
    """Exposes an array's memory through ``__array_interface__`` and keeps its owner alive."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, interface: dict[str, Any], owner: np.ndarray) -> None:
        self.__array_interface__ = interface
        self._owner = owner


def _writable_alias(array: np.ndarray) -> np.ndarray:
    interface = dict(array.__array_interface__)
    interface["data"] = (interface["data"][0], False)
    return np.asarray(_InterfaceKeeper(interface, array))


def export_from(producer: Any) -> object:
    """Ask a ``__dlpack__`` producer for a capsule, versioned when it supports DLPack 1.0."""
    try:
        return producer.__dlpack__(stream=None, max_version=(1, 0))
    except TypeError:
        return producer.__dlpack__(stream=None)


def export_array(array: np.ndarray, max_version: tuple[int, int] | None) -> object:
    """A capsule over ``array``'s memory, without copying wherever the memory allows it.

    A legacy capsule cannot signal "read-only", so NumPy refuses to export read-only arrays that
    way. For a read-only view over writable memory (received inputs), a writable alias of the same
    memory is exported: the consumer must not write to it. Memory that is truly immutable is copied.
    """
    if max_version is not None and max_version >= (1, 0):
        return array.__dlpack__(max_version=max_version)
    if array.flags.writeable:
        return array.__dlpack__()
    alias = array.view()
    try:
        alias.flags.writeable = True
    except ValueError:
        alias = array.copy()
    return alias.__dlpack__()
