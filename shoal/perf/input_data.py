"""perf_analyzer's ``--input-data`` JSON: ``{"data": [{"INPUT0": [1, 2], ...}, ...]}``.

Each input is a flat list of values (its shape then comes from the model's metadata) or an
object with ``content`` (or ``b64``) and ``shape``; shapes leave out the batch dimension, which
``--batch-size`` adds. shoal perf sends the first entry of ``data`` with every request.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shoal.perf.tensors import NUMPY_TYPES, TensorInfo, TensorSpec, tensor_from_array

_Array = np.ndarray[Any, Any]


def is_perf_analyzer_data(document: Any) -> bool:
    return isinstance(document, dict) and isinstance(document.get("data"), list)


def tensors_from_data(
    document: Mapping[str, Any], inputs: Sequence[TensorInfo], *, batch_size: int, batched: bool
) -> list[TensorSpec]:
    """The tensors of the first ``data`` entry, for the model inputs ``inputs``."""
    entries = document["data"]
    first = entries[0] if entries else None
    if isinstance(first, list):  # one list per sequence stream
        first = first[0] if first else None
    if not isinstance(first, dict):
        raise ValueError("--input-data: 'data' must hold at least one object of input values")
    tensors = []
    for info in inputs:
        if info.name not in first:
            raise ValueError(f"--input-data: the first 'data' entry has no input '{info.name}'")
        array = _array(info, first[info.name], batched)
        if batched:
            array = np.repeat(array[np.newaxis, ...], batch_size, axis=0)
        tensors.append(tensor_from_array(info.name, info.datatype, array))
    return tensors


def _array(info: TensorInfo, value: Any, batched: bool) -> _Array:
    shape: Sequence[int] | None = None
    if isinstance(value, dict):
        shape = value.get("shape")
        value = _decode_b64(info, value["b64"]) if "b64" in value else value.get("content")
    if not isinstance(value, list):
        raise ValueError(f"--input-data: input '{info.name}' needs a list of values")
    flat = np.ravel(np.array(value, dtype=object))
    dims = tuple(shape) if shape is not None else _metadata_shape(info, len(flat), batched)
    if int(np.prod(dims, dtype=np.int64)) != len(flat):
        raise ValueError(
            f"--input-data: input '{info.name}' has {len(flat)} values, its shape {list(dims)} "
            f"needs {int(np.prod(dims, dtype=np.int64))}"
        )
    return _typed(info, flat, dims)


def _decode_b64(info: TensorInfo, text: str) -> list[Any]:
    raw = base64.b64decode(text)
    if info.datatype == "BYTES":
        return [raw]
    values: list[Any] = np.frombuffer(raw, dtype=NUMPY_TYPES[info.datatype]).tolist()
    return values


def _typed(info: TensorInfo, flat: _Array, dims: tuple[int, ...]) -> _Array:
    if info.datatype == "BYTES":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
        return np.array(items, dtype=object).reshape(dims)
    return np.asarray(flat.tolist(), dtype=NUMPY_TYPES[info.datatype]).reshape(dims)


def _metadata_shape(info: TensorInfo, count: int, batched: bool) -> tuple[int, ...]:
    """The metadata shape without the batch dimension; one variable dimension takes ``count``."""
    dims = list(info.shape[1:] if batched else info.shape)
    variable = [i for i, d in enumerate(dims) if d < 0]
    if len(variable) > 1:
        raise ValueError(
            f"--input-data: input '{info.name}' has several variable dimensions {list(dims)}: "
            'give its "shape"'
        )
    if variable:
        fixed = int(np.prod([d for d in dims if d >= 0], dtype=np.int64))
        dims[variable[0]] = count // max(fixed, 1)
    return tuple(dims)
