"""``pb_utils.Tensor``: a named NumPy array with its V2 datatype, and its DLPack interface."""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.ipc.dtypes import numpy_to_datatype
from shoal.stub import _pb_dlpack as dlpack
from shoal.stub import _pb_gpu as gpu
from shoal.stub._pb_errors import TritonModelException

#: V2 datatype name -> Triton's ``TRITONSERVER_DataType`` value.
TRITON_DTYPE_VALUES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}


#: What a GPU tensor holds in place of host data; never read (every reader checks ``_gpu``).
_NO_HOST_DATA = np.empty(0, dtype=np.uint8)


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"Tensor name must be a str, not {type(name).__name__}")
    if not name:
        raise TritonModelException("Tensor name cannot be an empty string.")
    return name


def _datatype_of(array: np.ndarray) -> str:
    try:
        return numpy_to_datatype(array.dtype)
    except TypeError:
        raise TritonModelException("NumPy dtype is not supported.") from None


#: NumPy dtype -> V2 datatype, for the dtypes whose arrays a Tensor keeps as they are (no byte
#: swap; object and the fixed-size types): filled as they are met. A look-up here replaces
#: ``numpy_to_datatype`` and the byte order test for every output after the first of its dtype.
_AS_IS: dict[np.dtype, str] = {}
_NDARRAY = np.ndarray
#: Bound once: ``cls.__new__`` is an attribute look-up on the class per call.
_new = object.__new__


def _contiguous_little_endian(array: np.ndarray, datatype: str) -> np.ndarray:
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if datatype != "BYTES" and array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


class Tensor:
    """A named tensor: a model's input or output.

    ``Tensor(name, array)`` builds an output from a NumPy array. The array is kept by reference
    (copied only if it is not C-contiguous or not little-endian) and written to shared memory when
    the response is sent, so it should not be changed after it is handed to a response. Object,
    ``bytes_`` and ``str_`` arrays become BYTES tensors.

    A tensor made with ``from_dlpack`` of CUDA memory is a GPU tensor (``is_cpu()`` is false): it
    keeps the producer's device memory through a cupy array, without a copy.
    """

    __slots__ = ("_data", "_dtype", "_gpu", "_name", "_object_view")

    def __init__(self, name: str, array: np.ndarray) -> None:
        # The usual case (a NumPy array of a known dtype, native byte order) checked inline:
        # one call of a Python function costs ~300 instructions, and this runs for every output
        # of every response.
        if type(array) is not _NDARRAY:
            if array is None:  # Triton converts the arguments first: None is no NumPy array
                raise TypeError(f"tensor {name!r}: expected a NumPy array, got None")
            if not isinstance(array, _NDARRAY):
                array = np.asarray(array)
        self._name = name if type(name) is str and name else _check_name(name)
        datatype = _AS_IS.get(array.dtype)
        if datatype is None:
            datatype = _datatype_of(array)
            if datatype != "BYTES" and array.dtype.byteorder == ">":
                array = _contiguous_little_endian(array, datatype)
            elif datatype != "BYTES" or array.dtype.kind == "O":
                _AS_IS[array.dtype] = datatype  # not bytes_/str_: one dtype per item size
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._data = array
        self._dtype = datatype
        self._gpu: Any = None
        # ``_object_view`` stays unset until ``_array`` needs it (BYTES of bytes_/str_ only).

    # -- hooks for the stub runtime ------------------------------------------------------------

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """Wrap an array the runtime built (an input), without copying or validating it.

        ``datatype`` is the V2 name ("FP32", "BYTES", "BF16", ...). BYTES arrays are object arrays
        of ``bytes``; BF16 arrays hold the raw 16-bit words as ``uint16``.
        """
        tensor = _new(cls)
        tensor._name = name
        tensor._data = array
        tensor._dtype = datatype
        tensor._gpu = None
        return tensor

    @classmethod
    def _wrap_gpu(cls, name: str, array: Any, datatype: str) -> Tensor:
        """Wrap a cupy array (device memory) as a GPU tensor, without copying it."""
        tensor = cls._wrap(name, _NO_HOST_DATA, datatype)
        tensor._gpu = array
        return tensor

    def _datatype(self) -> str:
        """The V2 datatype name of this tensor."""
        return self._dtype

    def _array(self) -> np.ndarray:
        """The array for the runtime to write into shared memory (BYTES: an object array).

        A GPU tensor is copied to the host here, once: only where host bytes are needed, since
        the stub hands GPU tensors on through the CUDA pool (see docs/gpu.md)."""
        if self._gpu is not None:
            return gpu.to_host(self._gpu)
        if self._dtype != "BYTES" or self._data.dtype.kind == "O":
            return self._data
        view: np.ndarray | None = getattr(self, "_object_view", None)
        if view is None:
            # bytes_/str_ arrays: bytes objects (trailing NULs of bytes_ are dropped, as in Triton).
            if self._data.dtype.kind == "U":
                items = [item.encode("utf-8") for item in self._data.reshape(-1).tolist()]
            else:
                items = self._data.reshape(-1).tolist()
            flat = np.empty(len(items), dtype=np.object_)
            flat[:] = items
            view = self._object_view = flat.reshape(self._data.shape)
        return view

    # -- public API ----------------------------------------------------------------------------

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def shape(self) -> list[int]:
        """The tensor's shape."""
        source = self._data if self._gpu is None else self._gpu
        return [int(dim) for dim in source.shape]

    def is_cpu(self) -> bool:
        """Whether the data is in CPU memory (false for a tensor over CUDA memory)."""
        return self._gpu is None

    def triton_dtype(self) -> int:
        """The ``TRITONSERVER_DataType`` value (FP32 is 11, BYTES 13, BF16 14, ...)."""
        return TRITON_DTYPE_VALUES[self._dtype]

    def as_numpy(self) -> np.ndarray:
        """The data as a NumPy array (BYTES: an object array of ``bytes``).

        A received input is the model's own, as on Triton: writable, and nobody else sees the
        writes (the request's own shared-memory block, or a copy-on-write view of memory that
        others read too; docs/python_models.md). For a tensor the model built, this is the
        array it passed in. BF16 has no NumPy dtype: use DLPack instead.
        """
        if self._gpu is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._dtype == "BF16":
            raise TritonModelException(
                "Tensor of type BF16 cannot be converted to NumPy; use to_dlpack() instead."
            )
        return self._data

    def to_dlpack(self) -> Any:
        """A ``"dltensor"`` PyCapsule over the tensor's memory (zero-copy).

        The capsule of a received input aliases the same memory as ``as_numpy()``.
        """
        return self._export(None)

    def __dlpack__(
        self,
        stream: object = None,
        *,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack producer protocol; CPU data needs no stream synchronization."""
        if self._gpu is not None:
            return self._gpu.__dlpack__(stream=stream)
        if dl_device is not None and tuple(dl_device) != (dlpack.DEVICE_CPU, 0):
            raise BufferError(f"Tensor '{self._name}' is on the CPU; cannot export to {dl_device}")
        return self._export(max_version, copy=bool(copy))

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: ``(1, 0)`` for the CPU, ``(2, n)`` for CUDA device n."""
        if self._gpu is not None:
            return (dlpack.DEVICE_CUDA, gpu.device_of(self._gpu))
        return (dlpack.DEVICE_CPU, 0)

    def _export(self, max_version: tuple[int, int] | None, copy: bool = False) -> Any:
        if self._dtype == "BYTES":
            raise TritonModelException("DLPack does not support BYTES tensors.")
        if self._gpu is not None:
            capsule = (self._gpu.copy() if copy else self._gpu).toDlpack()
            if self._dtype == "BF16":
                dlpack.mark_bfloat16(capsule)
            return capsule
        array = self._data.copy() if copy else self._data
        capsule = dlpack.export_array(array, max_version)
        if self._dtype == "BF16":
            dlpack.mark_bfloat16(capsule)
        return capsule

    @staticmethod
    def from_dlpack(name: str, dlpack_obj: Any) -> Tensor:
        """A Tensor over a DLPack producer's memory, without copying.

        ``dlpack_obj`` is an object with ``__dlpack__`` (a NumPy array, a torch tensor, ...) or a
        ``"dltensor"`` PyCapsule such as ``torch.utils.dlpack.to_dlpack`` returns. The data must
        be C-contiguous. CUDA memory makes a GPU tensor (it needs cupy, ``shoal[gpu]``).
        """
        _check_name(name)
        if dlpack.is_capsule(dlpack_obj):
            capsule = dlpack_obj
        elif hasattr(dlpack_obj, "__dlpack__"):
            device = (dlpack.DEVICE_CPU, 0)
            if hasattr(dlpack_obj, "__dlpack_device__"):
                device_type, device_id = dlpack_obj.__dlpack_device__()
                device = (int(device_type), int(device_id))
            if dlpack.is_host_device(device[0]):
                capsule = dlpack.export_from(dlpack_obj)
            else:
                gpu.check_device(name, device)  # before the producer is asked to export
                # A legacy capsule: every cupy release imports it, not only those with 1.0.
                capsule = dlpack_obj.__dlpack__(stream=None)
        else:
            raise TritonModelException(
                "Tensor.from_dlpack expects a DLPack capsule or an object with __dlpack__, "
                f"got {type(dlpack_obj).__name__}"
            )
        device = _capsule_device(capsule)
        if not dlpack.is_host_device(device[0]):
            array, bfloat16 = gpu.import_device_capsule(name, capsule, device)
            return Tensor._wrap_gpu(name, array, gpu.datatype_of(array, bfloat16))
        try:
            bfloat16 = dlpack.check_importable(capsule)
            array = dlpack.import_capsule(capsule)
        except dlpack.DLPackError as error:
            raise TritonModelException(f"Tensor.from_dlpack('{name}'): {error}") from None
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
                "in C-Order are supported."
            )
        datatype = "BF16" if bfloat16 else _datatype_of(array)
        return Tensor._wrap(name, array, datatype)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, datatype={self._dtype}, shape={self.shape()})"


def _capsule_device(capsule: object) -> tuple[int, int]:
    try:
        return dlpack.capsule_device(capsule)
    except dlpack.DLPackError as error:
        raise TritonModelException(f"Tensor.from_dlpack: {error}") from None
