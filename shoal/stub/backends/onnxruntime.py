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
(default: this stub's ``OMP_NUM_THREADS`` when set, so instances do not oversubscribe the CPU),
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

from shoal.stub.backends._batching import Batching, Feed
from shoal.stub.backends._config import (
    ConfigTensor,
    bool_parameter,
    config_tensors,
    int_parameter,
    sequence_tensors,
)
from shoal.stub.backends._onnx_io import (
    GraphTensor,
    OnnxModelError,
    check_tensors,
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
        self.batching = Batching("", 0, {})

    # -- lifecycle --------------------------------------------------------------------------

    def initialize(self, args: Mapping[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.name = str(args.get("model_name") or config.get("name", ""))
        label = f"'{self.name}' version {args.get('model_version', '?')}"
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.session = self._session(args, config, label)
        configured_in = config_tensors(config, "input")
        configured_out = config_tensors(config, "output")
        graph_in, graph_out, overridable = _graph_tensors(self.session)
        controls, state_inputs, state_outputs = sequence_tensors(config)
        others = [t.name for t in overridable] + controls + state_inputs
        check_tensors(self.name, "input", configured_in, graph_in, self.max_batch_size, others)
        check_tensors(self.name, "output", configured_out, graph_out, self.max_batch_size)
        _check_state_outputs(state_outputs, graph_out, label)
        self.inputs = {t.name: t for t in configured_in}
        self.outputs = {t.name: t for t in configured_out}
        self._batching(graph_in, graph_out, state_outputs)

    def _session(self, args: Mapping[str, str], config: dict[str, Any], label: str) -> Any:
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
            return ort.InferenceSession(self.model_file, sess_options=options, providers=providers)
        except Exception as error:  # onnxruntime raises its own pybind exception types
            raise OnnxModelError(
                f"unable to load model {label}: onnxruntime cannot create a session for "
                f"'{self.model_file}': {error}"
            ) from None

    def _batching(
        self, graph_in: list[GraphTensor], graph_out: list[GraphTensor], state_outputs: list[str]
    ) -> None:
        """How batches are cut and joined; a model that does not batch may take scalars."""
        scalar_outputs: frozenset[str] = frozenset()
        if self.max_batch_size == 0:
            self._scalar_inputs = {t.name for t in graph_in if t.shape == ()}
            scalar_outputs = frozenset(t.name for t in graph_out if t.shape == ())
        self.batching = Batching(
            self.name, self.max_batch_size, self.outputs, state_outputs, scalar_outputs
        )

    def finalize(self) -> None:
        self.session = None

    # -- execute ----------------------------------------------------------------------------

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        return self.batching.execute(requests, self._feed, self._run)

    def _feed(self, request: Any) -> Feed:
        feed = {}
        for tensor in request.inputs():
            name = tensor.name()
            array = to_ort(name, tensor._array(), tensor._datatype())
            if name in self._scalar_inputs and array.size == 1:
                array = array.reshape(())
            feed[name] = array
        return feed

    def _run(self, names: list[str], feed: Feed) -> list[np.ndarray]:
        try:
            results = self.session.run(names, feed)
        except Exception as error:
            raise OnnxModelError(
                f"onnxruntime failed to run model '{self.name}': {error}".rstrip()
            ) from None
        return [from_ort(value) for value in results]


def _graph_tensors(session: Any) -> tuple[list[GraphTensor], list[GraphTensor], list[GraphTensor]]:
    """The session's inputs (overridable initializers included), outputs and overridables."""
    overridable = [_graph_tensor(t) for t in session.get_overridable_initializers()]
    graph_in = [_graph_tensor(t) for t in session.get_inputs()] + overridable
    return graph_in, [_graph_tensor(t) for t in session.get_outputs()], overridable


def _check_state_outputs(
    state_outputs: list[str], graph_out: list[GraphTensor], label: str
) -> None:
    graph_outputs = [t.name for t in graph_out]
    for name in state_outputs:
        if name not in graph_outputs:
            raise OnnxModelError(
                f"unable to load model {label}: sequence_batching state output '{name}' is "
                f"not an output of the ONNX graph (its outputs: {', '.join(graph_outputs)})"
            )


def _graph_tensor(node: Any) -> GraphTensor:
    return GraphTensor(str(node.name), str(node.type), graph_shape(node.shape))


def _session_options(ort: Any, config: Mapping[str, Any], model: str) -> Any:
    options = ort.SessionOptions()
    intra = int_parameter(config, "intra_op_thread_count", model)
    if intra is None or intra <= 0:
        share = os.environ.get("OMP_NUM_THREADS", "")
        intra = int(share) if share.isdigit() else 0
    if intra > 0:
        options.intra_op_num_threads = intra
    inter = int_parameter(config, "inter_op_thread_count", model)
    if inter is not None and inter > 0:
        options.inter_op_num_threads = inter
    mode = int_parameter(config, "execution_mode", model)
    if mode not in (None, 0, 1):
        raise OnnxModelError(
            f"unable to load model '{model}': execution_mode must be 0 (sequential) or 1 "
            f"(parallel), got {mode}"
        )
    if mode == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    arena = bool_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = bool_parameter(config, "enable_mem_pattern")
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
