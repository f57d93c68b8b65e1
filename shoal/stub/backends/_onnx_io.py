"""Tensors between shoal and onnxruntime: datatypes, shapes, and the checks made at load.

Nothing here imports onnxruntime: the session's inputs and outputs come in as
:class:`GraphTensor` (name, onnxruntime type string, shape), so the checks are testable alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.stub.backends._config import BackendModelError, ConfigTensor, config_type

#: onnxruntime's type strings -> V2 datatype.
ORT_DATATYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}
#: V2 datatypes this backend can pass to onnxruntime's Python API (BF16 has no NumPy dtype).
SUPPORTED = frozenset(ORT_DATATYPES.values()) - {"BF16"}


class OnnxModelError(BackendModelError):
    """The ONNX model cannot be loaded or run as configured; the message says what to change."""


@dataclass(frozen=True)
class GraphTensor:
    """An input or output of the session: ``shape`` has -1 where the graph's dim is symbolic,
    and is ``None`` when the graph does not give the rank."""

    name: str
    ort_type: str
    shape: tuple[int, ...] | None

    @property
    def datatype(self) -> str | None:
        return ORT_DATATYPES.get(self.ort_type)


def graph_shape(shape: Sequence[Any] | None) -> tuple[int, ...] | None:
    """onnxruntime's ``NodeArg.shape`` (ints, names of symbolic dims, None) with -1 for symbols."""
    if shape is None:
        return None
    return tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in shape)


def _shape_text(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_tensors(
    model: str,
    kind: str,
    configured: Sequence[ConfigTensor],
    graph: Sequence[GraphTensor],
    max_batch_size: int,
    unlisted: Iterable[str] = (),
) -> None:
    """Raise :class:`OnnxModelError` unless ``configured`` fits the graph's ``kind`` tensors.

    Every configured tensor must be in the graph with the same datatype and a compatible shape;
    every graph input must be configured, except those in ``unlisted``: initializers the graph
    lets a caller override, and the sequence batcher's control and state inputs.
    """
    by_name = {t.name: t for t in graph}
    names = ", ".join(t.name for t in graph) or "none"
    if kind == "input":
        _check_count(model, configured, graph, set(unlisted))
    for tensor in configured:
        found = by_name.get(tensor.name)
        if found is None:
            raise OnnxModelError(
                # Triton's onnxruntime backend's words first
                f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: {names}: "
                f"unable to load model '{model}': configuration has {kind} '{tensor.name}', "
                f"which the ONNX graph does not have (its {kind}s: {names})"
            )
        _check_datatype(model, kind, tensor, found)
        _check_shape(model, kind, tensor, found, max_batch_size)
    if kind == "input":
        _check_all_listed(model, configured, graph, set(unlisted))


def _check_datatype(model: str, kind: str, tensor: ConfigTensor, found: GraphTensor) -> None:
    if found.datatype not in SUPPORTED:
        raise OnnxModelError(
            f"unable to load model '{model}': {kind} '{tensor.name}' has ONNX type "
            f"{found.ort_type}, which shoal's onnxruntime backend does not support"
        )
    if found.datatype != tensor.datatype:
        raise OnnxModelError(
            f"unable to load model '{model}', configuration expects datatype "
            f"{config_type(tensor.datatype)} for {kind} '{tensor.name}', model provides "
            f"{config_type(found.datatype)}"
        )


def _check_count(
    model: str, configured: Sequence[ConfigTensor], graph: Sequence[GraphTensor], optional: set[str]
) -> None:
    """Triton's onnxruntime backend counts the inputs before it compares their names."""
    in_graph = {t.name for t in graph}
    extra = [c.name for c in configured if c.name not in in_graph]
    listed = {c.name for c in configured}
    missing = [t.name for t in graph if t.name not in listed and t.name not in optional]
    if len(configured) != len(graph) and (extra or missing):
        what = (
            f"configuration has input(s) {', '.join(repr(e) for e in extra)}, which the ONNX "
            "graph does not have"
            if extra
            else f"the ONNX graph has input(s) {', '.join(repr(m) for m in missing)} that the "
            "configuration does not list"
        )
        raise OnnxModelError(
            f"unable to load model '{model}', configuration expects {len(configured)} inputs, "
            f"model provides {len(graph)}: {what}"
        )


def _check_all_listed(
    model: str, configured: Sequence[ConfigTensor], graph: Sequence[GraphTensor], optional: set[str]
) -> None:
    """Every graph input is configured, but for the ``optional`` ones."""
    listed = {c.name for c in configured}
    missing = [t.name for t in graph if t.name not in listed and t.name not in optional]
    if missing:
        raise OnnxModelError(
            f"unable to load model '{model}': the ONNX graph has input(s) "
            f"{', '.join(repr(m) for m in missing)} that the configuration does not list: "
            "add them to config.pbtxt (or remove input/output there to have them filled in)"
        )


def _check_shape(
    model: str, kind: str, tensor: ConfigTensor, found: GraphTensor, max_batch_size: int
) -> None:
    if found.shape is None:
        return  # the graph does not say: onnxruntime checks at run time
    expected = ((-1,) if max_batch_size > 0 else ()) + tensor.model_dims
    got = found.shape
    if max_batch_size > 0 and (not got or got[0] != -1):
        raise OnnxModelError(
            f"unable to load model '{model}': {kind} '{tensor.name}' has shape "
            f"{_shape_text(got)} in the ONNX graph, but a model with max_batch_size > 0 needs a "
            "variable first (batch) dimension: set max_batch_size: 0 or export the model with a "
            "dynamic batch axis"
        )
    if max_batch_size == 0 and not got:
        _check_scalar(model, tensor)
        return
    compatible = len(expected) == len(got) and all(
        e == g or e == -1 or g == -1 for e, g in zip(expected, got, strict=True)
    )
    if not compatible:
        batch = "[-1] + " if max_batch_size > 0 else ""
        specified = (
            f"{len(expected)} dimensions (an initial batch dimension because max_batch_size > 0 "
            "followed by the explicit tensor shape, making complete shape "
            f"{_shape_text(expected)})"
            if max_batch_size > 0
            else f"{len(expected)} dimensions (shape {_shape_text(expected)})"
        )
        raise OnnxModelError(
            f"model '{model}', tensor '{tensor.name}': the model expects {len(got)} dimensions "
            f"(shape {_shape_text(got)}) but the model configuration specifies {specified}: "
            f"unable to load model '{model}': {kind} '{tensor.name}' has shape "
            f"{_shape_text(got)} in the ONNX graph, but the configuration gives "
            f"{batch}{_shape_text(tensor.model_dims)}: fix dims (or reshape) in config.pbtxt"
        )


def _check_scalar(model: str, tensor: ConfigTensor) -> None:
    """A rank-0 graph tensor of a model without batching is configured with ones only (``[1]``,
    ``[1,1]``...): the request's one element is fed as the scalar, and a scalar output is sent
    in the configured dims (Triton's onnxruntime backend, its words)."""
    if any(d != 1 for d in tensor.model_dims):
        raise OnnxModelError(
            f"unable to load model '{model}', scalar tensor '{tensor.name}', should only provide "
            "1 in the model configuration when the model doesn't support batching. Model "
            f"configuration provided: {_shape_text(tensor.model_dims)}."
        )


# -- values ---------------------------------------------------------------------------------


def to_ort(name: str, array: np.ndarray, datatype: str) -> np.ndarray:
    """What onnxruntime gets for an input.

    Numeric arrays are passed as they are: onnxruntime reads a C-contiguous array of the right
    dtype in place, read-only or not (no copy). BYTES arrays hold ``bytes``; onnxruntime's
    Python API takes text, so they are decoded (UTF-8) into a new object array.
    """
    if datatype != "BYTES":
        return array
    flat = array.reshape(-1)
    try:
        text = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
    except UnicodeDecodeError as error:
        raise OnnxModelError(
            f"input '{name}' holds bytes that are not UTF-8 text ({error.reason} at byte "
            f"{error.start}): onnxruntime's Python API only takes string tensors as text"
        ) from None
    out = np.empty(len(text), dtype=np.object_)
    out[:] = text
    return out.reshape(array.shape)


def from_ort(array: Any) -> np.ndarray:
    """An output of onnxruntime as shoal sends it (string tensors: ``bytes`` elements)."""
    result = np.asarray(array)
    if result.dtype.kind not in ("O", "U"):
        return result
    flat = result.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    out[:] = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in flat]
    return out.reshape(result.shape)


__all__ = [
    "ORT_DATATYPES",
    "SUPPORTED",
    "GraphTensor",
    "OnnxModelError",
    "check_tensors",
    "from_ort",
    "graph_shape",
    "to_ort",
]
