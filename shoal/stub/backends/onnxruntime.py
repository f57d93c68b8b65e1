"""The onnxruntime backend: ``<version>/model.onnx`` served through an ``InferenceSession``.

:class:`OnnxRuntimeModel` has the Python backend's ``initialize`` / ``execute`` / ``finalize``,
so a stub runs it like a ``model.py``:

* ``initialize`` creates one ``onnxruntime.InferenceSession`` for the instance (CPU; the CUDA
  execution provider first when the instance is ``KIND_GPU`` and onnxruntime has it) and checks
  the configuration's inputs and outputs against the graph.
* ``execute`` runs the whole batch of requests in one ``session.run`` when the model batches
  (``max_batch_size > 0``): each input is concatenated along the first dimension (a single
  request's input is passed as it is, without a copy), and each output is split back into
  per-request views. Only the outputs some request asked for are computed and returned.
* Numeric inputs are the stub's read-only views of shared memory; onnxruntime reads them in
  place (no copy). String inputs are decoded to ``str`` once (onnxruntime's Python API takes text).

Session options follow the parameters of Triton's onnxruntime backend: ``intra_op_thread_count``
(default: this stub's ``OMP_NUM_THREADS`` share, so instances do not oversubscribe the CPU),
``inter_op_thread_count``, ``execution_mode`` (0 sequential, 1 parallel), ``enable_mem_arena``,
``enable_mem_pattern``, and ``optimization { graph { level } }`` (-1 basic, 1 extended,
2 disabled, otherwise all optimizations).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shoal.stub import pb_utils
from shoal.stub.backends._onnx_io import (
    ConfigTensor,
    GraphTensor,
    OnnxModelError,
    check_tensors,
    config_tensors,
    from_ort,
    graph_shape,
    to_ort,
)

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"


def create_model(model_file: str) -> OnnxRuntimeModel:
    return OnnxRuntimeModel(model_file)


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise OnnxModelError(
            f"the onnxruntime backend needs the onnxruntime package, which cannot be imported "
            f"({error}): install it with `pip install onnxruntime` (or `pip install "
            "'shoal[onnx]'`) in the Python that runs shoal"
        ) from None
    return onnxruntime


class OnnxRuntimeModel:
    """One instance of an ONNX model; see the module's documentation."""

    def __init__(self, model_file: str) -> None:
        self.model_file = model_file
        self.name = ""
        self.session: Any = None
        self.max_batch_size = 0
        self.inputs: dict[str, ConfigTensor] = {}
        self.outputs: dict[str, ConfigTensor] = {}
        self._scalar_inputs: set[str] = set()
        self._scalar_outputs: set[str] = set()
        #: implicit-state outputs of the sequence batcher (requested, though not in ``output``).
        self._state_outputs: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------

    def initialize(self, args: Mapping[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.name = str(args.get("model_name") or config.get("name", ""))
        label = f"'{self.name}' version {args.get('model_version', '?')}"
        self.max_batch_size = int(config.get("max_batch_size", 0))
        if not os.path.isfile(self.model_file):
            raise OnnxModelError(
                f"unable to load model {label}: ONNX model file '{self.model_file}' not found "
                f"(put the model in {os.path.dirname(self.model_file)}, or set "
                "default_model_filename)"
            )
        ort = _import_onnxruntime()
        options = _session_options(ort, config, self.name)
        providers = _providers(ort, args)
        try:
            self.session = ort.InferenceSession(
                self.model_file, sess_options=options, providers=providers
            )
        except Exception as error:  # onnxruntime raises its own pybind exception types
            raise OnnxModelError(
                f"unable to load model {label}: onnxruntime cannot create a session for "
                f"'{self.model_file}': {error}"
            ) from None
        configured_in = config_tensors(config, "input")
        configured_out = config_tensors(config, "output")
        overridable = [_graph_tensor(t) for t in self.session.get_overridable_initializers()]
        graph_in = [_graph_tensor(t) for t in self.session.get_inputs()] + overridable
        graph_out = [_graph_tensor(t) for t in self.session.get_outputs()]
        sequence = config.get("sequence_batching") or {}
        controls = [str(c.get("name", "")) for c in sequence.get("control_input", []) or []]
        states = sequence.get("state", []) or []
        check_tensors(
            self.name,
            "input",
            configured_in,
            graph_in,
            self.max_batch_size,
            [t.name for t in overridable] + controls + [str(s.get("input_name")) for s in states],
        )
        check_tensors(self.name, "output", configured_out, graph_out, self.max_batch_size)
        self.inputs = {t.name: t for t in configured_in}
        self.outputs = {t.name: t for t in configured_out}
        graph_outputs = [t.name for t in graph_out]
        self._state_outputs = [str(s.get("output_name", "")) for s in states]
        for name in self._state_outputs:
            if name not in graph_outputs:
                raise OnnxModelError(
                    f"unable to load model {label}: sequence_batching state output '{name}' is "
                    f"not an output of the ONNX graph (its outputs: {', '.join(graph_outputs)})"
                )
        if self.max_batch_size == 0:
            self._scalar_inputs = {t.name for t in graph_in if t.shape == ()}
            self._scalar_outputs = {t.name for t in graph_out if t.shape == ()}

    def finalize(self) -> None:
        self.session = None

    # -- execute ----------------------------------------------------------------------------

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        feeds: list[tuple[int, dict[str, np.ndarray]]] = []
        for index, request in enumerate(requests):
            try:
                feeds.append((index, self._feed(request)))
            except OnnxModelError as error:
                responses[index] = _error(f"model '{self.name}': {error}")
        if self.max_batch_size > 0 and len(feeds) > 1:
            self._run_batched(requests, feeds, responses)
        else:
            for index, feed in feeds:
                self._run_one(requests[index], index, feed, responses)
        return responses

    def _feed(self, request: Any) -> dict[str, np.ndarray]:
        feed = {}
        for tensor in request.inputs():
            name = tensor.name()
            array = to_ort(name, tensor._array(), tensor._datatype())
            if name in self._scalar_inputs and array.size == 1:
                array = array.reshape(())
            feed[name] = array
        return feed

    def _wanted(self, requests: Sequence[Any]) -> list[str]:
        """The outputs to compute: those any request asked for (every configured one for a
        request that named none), in configuration order, then implicit-state outputs."""
        wanted: set[str] = set()
        for request in requests:
            names = request.requested_output_names()
            wanted.update(names or self.outputs)
        known = [*self.outputs, *(n for n in self._state_outputs if n not in self.outputs)]
        return [name for name in known if name in wanted]

    def _run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[Any]:
        try:
            return list(self.session.run(names, feed))
        except Exception as error:
            raise OnnxModelError(
                f"onnxruntime failed to run model '{self.name}': {error}".rstrip()
            ) from None

    def _run_one(
        self, request: Any, index: int, feed: dict[str, np.ndarray], responses: list[Any]
    ) -> None:
        names = self._wanted([request])
        try:
            results = self._run(names, feed)
        except OnnxModelError as error:
            responses[index] = _error(str(error))
            return
        batch = self._batch_of(feed)
        tensors = [
            pb_utils.Tensor(name, self._client_shape(name, from_ort(value), batch))
            for name, value in zip(names, results, strict=True)
        ]
        responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _run_batched(
        self,
        requests: Sequence[Any],
        feeds: list[tuple[int, dict[str, np.ndarray]]],
        responses: list[Any],
    ) -> None:
        """One ``session.run`` over the requests concatenated along the batch dimension."""
        indices = [index for index, _ in feeds]
        sizes = [self._batch_of(feed) for _, feed in feeds]
        try:
            feed = _concatenate(self.name, [f for _, f in feeds])
            names = self._wanted([requests[i] for i in indices])
            results = self._run(names, feed)
            total = sum(sizes)
            outputs = [from_ort(value) for value in results]
            for name, value in zip(names, outputs, strict=True):
                if value.ndim == 0 or value.shape[0] != total:
                    raise OnnxModelError(
                        f"output '{name}' of model '{self.name}' has shape {list(value.shape)} "
                        f"for a batch of {total}: a batching model's outputs must have the batch "
                        "size as first dimension"
                    )
        except OnnxModelError as error:
            for index in indices:
                responses[index] = _error(str(error))
            return
        bounds = np.cumsum(sizes)[:-1]
        parts = [np.split(value, bounds) for value in outputs]
        for slot, (index, size) in enumerate(zip(indices, sizes, strict=True)):
            requested = requests[index].requested_output_names()
            tensors = [
                pb_utils.Tensor(name, self._client_shape(name, part[slot], size))
                for name, part in zip(names, parts, strict=True)
                if not requested or name in requested
            ]
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _batch_of(self, feed: Mapping[str, np.ndarray]) -> int:
        if self.max_batch_size == 0:
            return 0
        for array in feed.values():
            if array.ndim > 0:
                return int(array.shape[0])
        return 1

    def _client_shape(self, name: str, value: np.ndarray, batch: int) -> np.ndarray:
        """The output in the shape the configuration gives the client (its ``dims``)."""
        spec = self.outputs.get(name)
        if name in self._scalar_outputs and value.ndim == 0:
            return value.reshape(1)
        if spec is None or not spec.has_reshape:
            return value
        shape = ((batch,) if self.max_batch_size > 0 else ()) + spec.dims
        if sum(1 for d in shape if d < 0) > 1:
            return value  # cannot infer more than one variable dim: leave the model's shape
        try:
            return value.reshape(shape)
        except ValueError:
            return value


def _concatenate(model: str, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    names = list(feeds[0])
    for feed in feeds[1:]:
        if set(feed) != set(names):
            raise OnnxModelError(
                f"the requests batched for model '{model}' carry different inputs "
                f"({sorted(names)} and {sorted(feed)}); optional inputs must be given by all "
                "requests of a batch or by none"
            )
    joined = {}
    for name in names:
        arrays = [feed[name] for feed in feeds]
        try:
            joined[name] = np.concatenate(arrays, axis=0)
        except ValueError:
            shapes = ", ".join(str(list(a.shape)) for a in arrays)
            raise OnnxModelError(
                f"input '{name}' of the requests batched for model '{model}' cannot be "
                f"concatenated along the batch dimension (shapes {shapes})"
            ) from None
    return joined


def _graph_tensor(node: Any) -> GraphTensor:
    return GraphTensor(str(node.name), str(node.type), graph_shape(node.shape))


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def _parameter(config: Mapping[str, Any], key: str) -> str | None:
    value = (config.get("parameters") or {}).get(key)
    if isinstance(value, Mapping):
        value = value.get("string_value")
    return None if value is None else str(value)


def _int_parameter(config: Mapping[str, Any], key: str, model: str) -> int | None:
    raw = _parameter(config, key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise OnnxModelError(
            f"unable to load model '{model}': parameter {key} must be an integer, got '{raw}'"
        ) from None


def _bool_parameter(config: Mapping[str, Any], key: str) -> bool | None:
    raw = _parameter(config, key)
    if raw is None or raw == "":
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _session_options(ort: Any, config: Mapping[str, Any], model: str) -> Any:
    options = ort.SessionOptions()
    intra = _int_parameter(config, "intra_op_thread_count", model)
    if intra is None or intra <= 0:
        share = os.environ.get("OMP_NUM_THREADS", "")
        intra = int(share) if share.isdigit() else 0
    if intra > 0:
        options.intra_op_num_threads = intra
    inter = _int_parameter(config, "inter_op_thread_count", model)
    if inter is not None and inter > 0:
        options.inter_op_num_threads = inter
    mode = _int_parameter(config, "execution_mode", model)
    if mode not in (None, 0, 1):
        raise OnnxModelError(
            f"unable to load model '{model}': execution_mode must be 0 (sequential) or 1 "
            f"(parallel), got {mode}"
        )
    if mode == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    arena = _bool_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = _bool_parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern
    level = int(((config.get("optimization") or {}).get("graph") or {}).get("level", 0) or 0)
    levels = ort.GraphOptimizationLevel
    options.graph_optimization_level = {
        -1: levels.ORT_ENABLE_BASIC,
        1: levels.ORT_ENABLE_EXTENDED,
        2: levels.ORT_DISABLE_ALL,
    }.get(level, levels.ORT_ENABLE_ALL)
    return options


def _providers(ort: Any, args: Mapping[str, str]) -> list[Any]:
    """CPU; CUDA first for a GPU instance when this onnxruntime build has it (untested here)."""
    if args.get("model_instance_kind") == "GPU" and _CUDA in ort.get_available_providers():
        device = int(args.get("model_instance_device_id", "0") or 0)
        return [(_CUDA, {"device_id": device}), _CPU]
    return [_CPU]


__all__ = ["OnnxRuntimeModel", "create_model"]
