"""Complete an ONNX model's configuration from its graph, as Triton's onnxruntime backend does.

Runs at load unless ``--strict-model-config=true``, for a model whose backend is
``onnxruntime`` (``platform: "onnxruntime_onnx"``, or no configuration and a ``model.onnx``).
When the configuration lists both inputs and outputs nothing changes. Otherwise, from the
graph of the latest version's model file:

* **Batching**: the model can batch when every input and output has a variable first dimension.
  Then ``max_batch_size`` 0 becomes the default (4, or ``--backend-config
  onnxruntime,default-max-batch-size=N``), and a ``max_batch_size`` above 1 without a scheduler
  gets ``dynamic_batching {}``. A model that cannot batch but is configured with
  ``max_batch_size > 0`` fails to load.
* **Inputs / outputs** that the configuration leaves out are filled in graph order: the name,
  the datatype, and the dims without the batch dimension when ``max_batch_size > 0``. A tensor
  whose dims would be empty gets ``dims: [1]`` (and ``reshape { shape: [] }`` when batching).
  Graph inputs that are initializers (overridable weights) are not listed.

The graph is read with the ``onnx`` package (no session is created and the weights stored in
external files are not read), in a worker thread so that the event loop keeps serving. ``onnx``
is imported only here, when an ONNX model needs completing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb

BACKEND = "onnxruntime"
PLATFORM = "onnxruntime_onnx"
DEFAULT_FILENAME = "model.onnx"
#: Triton's default for ``default-max-batch-size``.
DEFAULT_MAX_BATCH_SIZE = 4

#: ONNX ``TensorProto.DataType`` values -> ModelConfig datatypes (Triton's mapping).
ONNX_CONFIG_TYPES: dict[int, int] = {
    1: pb.TYPE_FP32,  # FLOAT
    2: pb.TYPE_UINT8,
    3: pb.TYPE_INT8,
    4: pb.TYPE_UINT16,
    5: pb.TYPE_INT16,
    6: pb.TYPE_INT32,
    7: pb.TYPE_INT64,
    8: pb.TYPE_STRING,
    9: pb.TYPE_BOOL,
    10: pb.TYPE_FP16,
    11: pb.TYPE_FP64,  # DOUBLE
    12: pb.TYPE_UINT32,
    13: pb.TYPE_UINT64,
    16: pb.TYPE_BF16,
}


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output: ``elem_type`` is ONNX's, ``dims`` has -1 for symbolic dims and
    is ``None`` when the graph gives no shape; ``kind`` names a non-tensor type."""

    name: str
    elem_type: int
    dims: tuple[int, ...] | None
    kind: str = "tensor_type"


@dataclass(frozen=True)
class Graph:
    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]


# -- which models -----------------------------------------------------------------------------


def is_onnx_model(path: str | Path, proto: pb.ModelConfig) -> bool:
    """Whether the model of ``proto`` (in ``path``) runs on the onnxruntime backend."""
    if proto.backend or proto.platform:
        return proto.backend == BACKEND or (not proto.backend and proto.platform == PLATFORM)
    detected = model_config.detect_backend(Path(path), proto.default_model_filename)
    return detected == BACKEND


def model_file(path: str | Path, proto: pb.ModelConfig, versions: Sequence[int]) -> Path | None:
    """The latest version's ONNX file, when the model is an ONNX model and the file exists."""
    if not versions or not is_onnx_model(path, proto):
        return None
    candidate = Path(path) / str(max(versions)) / (proto.default_model_filename or DEFAULT_FILENAME)
    return candidate if candidate.is_file() else None


def wants_auto_complete(proto: pb.ModelConfig) -> bool:
    """Triton completes unless the configuration has inputs (or batch inputs) and outputs."""
    return not ((proto.input or proto.batch_input) and proto.output)


def default_max_batch_size(settings: Iterable[tuple[str, str, str]]) -> int:
    """``--backend-config onnxruntime,default-max-batch-size=N`` (default 4)."""
    value = DEFAULT_MAX_BATCH_SIZE
    for backend, key, raw in settings:
        if backend == BACKEND and key == "default-max-batch-size":
            try:
                value = int(raw)
            except ValueError:
                raise model_config.ConfigError(
                    f"--backend-config {backend},{key}={raw}: the value must be an integer"
                ) from None
    return max(value, 0)


# -- reading the graph ------------------------------------------------------------------------


def read_graph(path: str | Path) -> Graph:
    """Inputs and outputs of the ONNX graph in ``path``; raises ConfigError."""
    try:
        import onnx
    except ImportError:
        raise model_config.ConfigError(
            f"completing the configuration of ONNX model '{path}' from its graph needs the "
            "'onnx' package: install it (pip install onnx, or 'shoal[onnx]'), or list the "
            "model's inputs, outputs and max_batch_size in config.pbtxt"
        ) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises protobuf DecodeError, OSError, ...
        raise model_config.ConfigError(
            f"cannot read the ONNX graph of '{path}' to complete its configuration: {error}"
        ) from None
    return _graph(model.graph)


def _graph(graph: Any) -> Graph:
    """The graph's inputs (its weights left out) and outputs."""
    weights = {t.name for t in graph.initializer}
    weights.update(t.values.name for t in getattr(graph, "sparse_initializer", []))
    inputs = tuple(_tensor(v) for v in graph.input if v.name not in weights)
    return Graph(inputs, tuple(_tensor(v) for v in graph.output))


def _tensor(value_info: Any) -> GraphTensor:
    kind = value_info.type.WhichOneof("value") or "unknown"
    if kind != "tensor_type":
        return GraphTensor(value_info.name, 0, None, kind)
    tensor = value_info.type.tensor_type
    dims: tuple[int, ...] | None = None
    if tensor.HasField("shape"):
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return GraphTensor(value_info.name, int(tensor.elem_type), dims)


async def auto_complete(
    path: Path, proto: pb.ModelConfig, *, model: str, default_max_batch: int
) -> pb.ModelConfig:
    """``proto`` completed from the graph of ``path`` (a copy); raises ConfigError."""
    graph = await asyncio.to_thread(read_graph, path)
    return complete_from_graph(proto, graph, model=model, default_max_batch=default_max_batch)


# -- completing -------------------------------------------------------------------------------


def complete_from_graph(
    proto: pb.ModelConfig, graph: Graph, *, model: str, default_max_batch: int
) -> pb.ModelConfig:
    """Triton's onnxruntime auto-complete of ``proto`` from ``graph`` (a completed copy)."""
    config = pb.ModelConfig()
    config.CopyFrom(proto)
    if not wants_auto_complete(config):
        return config
    for tensor in (*graph.inputs, *graph.outputs):
        _check_tensor(tensor, model)
    batching = all(t.dims and t.dims[0] == -1 for t in (*graph.inputs, *graph.outputs))
    _complete_batching(config, batching, model, default_max_batch)
    if not config.input and not config.batch_input:
        for tensor in graph.inputs:
            _fill(config.input.add(), tensor, config.max_batch_size)
    if not config.output:
        for tensor in graph.outputs:
            _fill(config.output.add(), tensor, config.max_batch_size)
    return config


def _complete_batching(
    config: pb.ModelConfig, batching: bool, model: str, default_max_batch: int
) -> None:
    """A graph whose every tensor has a variable first dimension batches (with the dynamic
    batcher unless another scheduler is set); any other must not."""
    if batching:
        _batch(config, default_max_batch)
    elif config.max_batch_size != 0:
        raise model_config.ConfigError(
            f"autofill failed for model '{model}': model does not support batching while "
            f"non-zero max_batch_size is specified (max_batch_size {config.max_batch_size}, but "
            "not every input and output of the ONNX graph has a variable first dimension): set "
            "max_batch_size: 0, or export the model with a dynamic batch axis",
            field_path=("max_batch_size",),
        )


def _batch(config: pb.ModelConfig, default_max_batch: int) -> None:
    if config.max_batch_size == 0:
        config.max_batch_size = default_max_batch
    has_scheduler = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
    if config.max_batch_size > 1 and not has_scheduler:
        config.dynamic_batching.SetInParent()


def _check_tensor(tensor: GraphTensor, model: str) -> None:
    if tensor.kind != "tensor_type":
        raise model_config.ConfigError(
            f"cannot complete the configuration of model '{model}': graph input/output "
            f"'{tensor.name}' is a {tensor.kind.removesuffix('_type')}, not a tensor; only "
            "tensors can be served"
        )
    if tensor.elem_type not in ONNX_CONFIG_TYPES:
        raise model_config.ConfigError(
            f"cannot complete the configuration of model '{model}': graph input/output "
            f"'{tensor.name}' has ONNX element type {tensor.elem_type}, which has no Triton "
            "datatype"
        )
    if tensor.dims is None:
        raise model_config.ConfigError(
            f"cannot complete the configuration of model '{model}': the ONNX graph gives no "
            f"shape for '{tensor.name}': list the model's inputs and outputs in config.pbtxt"
        )


def _fill(entry: pb.ModelInput | pb.ModelOutput, tensor: GraphTensor, max_batch: int) -> None:
    assert tensor.dims is not None
    entry.name = tensor.name
    entry.data_type = ONNX_CONFIG_TYPES[tensor.elem_type]  # type: ignore[assignment]
    dims = tensor.dims[1:] if max_batch > 0 else tensor.dims
    if dims:
        entry.dims.extend(dims)
        return
    entry.dims.append(1)
    if max_batch > 0:
        entry.reshape.SetInParent()


__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "ONNX_CONFIG_TYPES",
    "Graph",
    "GraphTensor",
    "auto_complete",
    "complete_from_graph",
    "default_max_batch_size",
    "is_onnx_model",
    "model_file",
    "read_graph",
    "wants_auto_complete",
]
