"""The input tensors a load run sends: from ``--input`` specs, a JSON file or model metadata.

Every tensor carries its data already laid out as the V2 binary extension wants it (raw
little-endian elements; BYTES as 4-byte length + bytes per element), so requests are serialised
once and re-sent.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: V2 datatype -> NumPy dtype (BYTES is handled apart).
NUMPY_TYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "int8",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class TensorSpec:
    """One input: its V2 name, datatype and shape, and its data in binary-extension layout."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def json_data(self) -> list[Any]:
        """The flattened elements, as the JSON form of a V2 request carries them."""
        if self.datatype == "BYTES":
            return [item.decode("utf-8", "replace") for item in split_bytes(self.data)]
        array = np.frombuffer(self.data, dtype=NUMPY_TYPES[self.datatype])
        values: list[Any] = array.tolist()
        return values


@dataclass(frozen=True)
class TensorInfo:
    """What model metadata says of one tensor (``-1`` for a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def element_size(datatype: str) -> int | None:
    """Bytes per element, or None for BYTES."""
    numpy_type = NUMPY_TYPES.get(datatype)
    if numpy_type is None:
        if datatype == "BYTES":
            return None
        raise ValueError(f"unknown datatype '{datatype}'")
    return np.dtype(numpy_type).itemsize


def serialize_bytes(items: Sequence[bytes]) -> bytes:
    """BYTES elements in the binary extension's layout."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def split_bytes(data: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(data):
        (size,) = _LENGTH.unpack_from(data, offset)
        items.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return items


def tensor_from_array(name: str, datatype: str, array: np.ndarray[Any, Any]) -> TensorSpec:
    shape = tuple(int(d) for d in array.shape)
    if datatype == "BYTES":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        return TensorSpec(name, datatype, shape, serialize_bytes(items))
    typed = np.ascontiguousarray(array, dtype=NUMPY_TYPES[datatype])
    return TensorSpec(name, datatype, shape, typed.tobytes())


def random_tensor(name: str, datatype: str, shape: Sequence[int], seed: int = 0) -> TensorSpec:
    """Reproducible data; integers stay in 1..8 so that counts and indices stay small."""
    rng = np.random.default_rng(seed)
    dims = tuple(shape)
    if datatype == "BYTES":
        return tensor_from_array(name, datatype, np.full(dims, b"shoal-perf", dtype=object))
    if datatype == "BOOL":
        return tensor_from_array(name, datatype, rng.integers(0, 2, dims).astype(bool))
    if datatype.startswith("FP"):
        return tensor_from_array(name, datatype, rng.random(dims))
    return tensor_from_array(name, datatype, rng.integers(1, 9, dims))


def parse_input_spec(text: str) -> tuple[str, str, tuple[int, ...]]:
    """``NAME:DATATYPE:D0,D1`` (e.g. ``INPUT0:FP32:1,16``) -> (name, datatype, shape)."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"--input expects NAME:DATATYPE:SHAPE, got '{text}'")
    name, datatype, dims = parts[0], parts[1].upper(), parts[2]
    element_size(datatype)  # raises for an unknown datatype
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    except ValueError:
        raise ValueError(f"shape '{dims}' of --input '{name}' is not a list of integers") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"shape of --input '{name}' must be concrete, got {dims}")
    return name, datatype, shape


def tensors_from_json(path: Path) -> list[TensorSpec]:
    """The inputs of a V2 JSON request body: ``{"inputs": [{name, datatype, shape, data}]}``."""
    document = json.loads(path.read_text())
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list) or not inputs:
        raise ValueError(f"{path}: expected a V2 request body with a non-empty 'inputs' list")
    tensors = []
    for entry in inputs:
        name, datatype = str(entry["name"]), str(entry["datatype"]).upper()
        tensors.append(tensor_from_array(name, datatype, _json_array(entry, datatype)))
    return tensors


def _json_array(entry: dict[str, Any], datatype: str) -> np.ndarray[Any, Any]:
    shape = tuple(int(d) for d in entry["shape"])
    if datatype == "BYTES":
        flat = np.array([str(v).encode() for v in np.ravel(entry["data"])], dtype=object)
        return flat.reshape(shape)
    return np.asarray(entry["data"], dtype=NUMPY_TYPES[datatype]).reshape(shape)


def concrete_shape(
    shape: Sequence[int],
    datatype: str,
    payload_bytes: int | None,
    *,
    batched: bool,
    batch_size: int = 1,
) -> tuple[int, ...]:
    """A shape for ``shape`` with its ``-1`` filled in.

    The batch dimension of a batched model becomes ``batch_size``; the last variable dimension
    takes what makes the tensor ``payload_bytes`` long (when given), the others become 1.
    """
    dims = list(shape)
    if batched and dims and dims[0] == -1:
        dims[0] = batch_size
    variable = [i for i, d in enumerate(dims) if d < 0]
    for i in variable:
        dims[i] = 1
    if variable and payload_bytes is not None:
        dims[variable[-1]] = _payload_dim(dims, variable[-1], datatype, payload_bytes)
    return tuple(dims)


def _payload_dim(dims: list[int], last: int, datatype: str, payload_bytes: int) -> int:
    """The size of dimension ``last`` that makes the tensor ``payload_bytes`` long."""
    size = element_size(datatype) or 1
    fixed = int(np.prod([d for i, d in enumerate(dims) if i != last], dtype=np.int64))
    return max(1, payload_bytes // (size * max(fixed, 1)))


def tensors_from_metadata(
    inputs: Sequence[TensorInfo],
    payload_bytes: int | None,
    *,
    batched: bool,
    batch_size: int = 1,
    zeros: bool = False,
) -> list[TensorSpec]:
    """Random (or, with ``zeros``, zero) data of the shapes the metadata gives."""
    tensors = []
    for index, info in enumerate(inputs):
        shape = concrete_shape(
            info.shape, info.datatype, payload_bytes, batched=batched, batch_size=batch_size
        )
        if zeros:
            tensors.append(zero_tensor(info.name, info.datatype, shape))
        else:
            tensors.append(random_tensor(info.name, info.datatype, shape, seed=index))
    return tensors


def zero_tensor(name: str, datatype: str, shape: Sequence[int]) -> TensorSpec:
    """perf_analyzer's ``--input-data zero``: zeros, and empty strings for BYTES."""
    if datatype == "BYTES":
        return tensor_from_array(name, datatype, np.full(tuple(shape), b"", dtype=object))
    return tensor_from_array(name, datatype, np.zeros(tuple(shape), dtype=NUMPY_TYPES[datatype]))
