"""The PyTorch backend: ``<version>/model.pt`` (TorchScript) served through ``torch.jit.load``.

:class:`TorchScriptModel` has the Python backend's ``initialize`` / ``execute`` / ``finalize``,
so a stub runs it like a ``model.py``:

* ``initialize`` loads the module once per instance (on the CPU, or on ``cuda:<device id>`` for
  a ``KIND_GPU`` instance), maps the configured inputs and outputs to ``forward()``'s arguments
  and results by Triton's naming conventions (see ``_torch_io``), and applies the parameters
  of Triton's PyTorch backend (see ``_torch_options``).
* ``execute`` runs a batch of requests with one ``forward()`` call when the model batches (the
  shared :class:`~shoal.stub.backends._batching.Batching`), under ``torch.no_grad()`` (or
  ``torch.inference_mode()`` with ``INFERENCE_MODE``).
* Numeric inputs become tensors over the stub's shared-memory views without a copy on the CPU
  (a GPU instance copies them to its device); outputs come back to the CPU and are checked
  against the configured datatypes. ``TYPE_STRING`` tensors are ``List[str]`` for the model.

torch is imported only here, when a model uses this backend, so it stays optional.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shoal.stub import pb_utils
from shoal.stub.backends._batching import Batching, Feed
from shoal.stub.backends._config import (
    ConfigTensor,
    config_tensors,
    config_type,
    sequence_tensors,
)
from shoal.stub.backends._torch_io import (
    V2_DATATYPES,
    Argument,
    Convention,
    TensorMap,
    TorchModelError,
    check_argument_types,
    check_datatypes,
    check_indices,
    check_strings,
    map_inputs,
    map_outputs,
    strings_in,
    strings_out,
)
from shoal.stub.backends._torch_options import TorchOptions, apply_options, read_options


def create_model(model_file: str) -> TorchScriptModel:
    return TorchScriptModel(model_file)


def _import_torch() -> Any:
    # importlib rather than `import torch`: the stub runs without torch for every other model,
    # and mypy need not analyse all of torch to check this module.
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        raise TorchModelError(
            f"the pytorch backend needs the torch package, which cannot be imported ({error}): "
            "install it with `pip install torch` (or `pip install 'shoal[torch]'`) in the Python "
            "that runs shoal"
        ) from None


class TorchScriptModel:
    """One instance of a TorchScript model; see the module's documentation."""

    def __init__(self, model_file: str) -> None:
        self.model_file = model_file
        self.name = ""
        self.torch: Any = None
        self.module: Any = None
        self.device: Any = None
        self.options = TorchOptions()
        self.inputs: dict[str, ConfigTensor] = {}
        self.outputs: dict[str, ConfigTensor] = {}
        self.input_map = TensorMap(Convention.CONFIG_ORDER, {})
        self.output_map = TensorMap(Convention.CONFIG_ORDER, {})
        self.argument_count = 0
        self.batching = Batching("", 0, {})

    # -- lifecycle --------------------------------------------------------------------------

    def initialize(self, args: Mapping[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.name = str(args.get("model_name") or config.get("name", ""))
        label = f"'{self.name}' version {args.get('model_version', '?')}"
        max_batch_size = int(config.get("max_batch_size", 0))
        self._load_module(args, config, label)
        inputs, outputs = config_tensors(config, "input"), config_tensors(config, "output")
        self._check_tensors(inputs, outputs, max_batch_size)
        self.inputs = {t.name: t for t in inputs}
        self.outputs = {t.name: t for t in outputs}
        controls, state_inputs, state_outputs = sequence_tensors(config)
        self._map_arguments(inputs, [*self.inputs, *controls, *state_inputs], label)
        self.output_map = map_outputs(self.name, [*self.outputs, *state_outputs])
        self._warn_config_order()
        scalars = _scalar_outputs(outputs, max_batch_size)
        self.batching = Batching(self.name, max_batch_size, self.outputs, state_outputs, scalars)
        # Inputs are read-only views of shared memory; torch warns about each one it wraps.
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)

    def _check_tensors(
        self, inputs: list[ConfigTensor], outputs: list[ConfigTensor], max_batch_size: int
    ) -> None:
        for kind, tensors in (("input", inputs), ("output", outputs)):
            check_datatypes(self.name, kind, tensors)
            check_strings(self.name, kind, tensors, max_batch_size)

    def _load_module(self, args: Mapping[str, str], config: dict[str, Any], label: str) -> None:
        """Import torch with the model's options and load the TorchScript file on its device."""
        if not os.path.isfile(self.model_file):
            raise TorchModelError(
                f"unable to load model {label}: TorchScript model file '{self.model_file}' not "
                f"found (put the model in {os.path.dirname(self.model_file)}, or set "
                "default_model_filename)"
            )
        torch = self.torch = _import_torch()
        self.options = read_options(config, self.name)
        for warning in apply_options(torch, self.options):
            pb_utils.Logger.log_warn(f"model '{self.name}': {warning}")
        self.device = _device(torch, args, label)
        self.module = _load(torch, self.model_file, self.device, label)

    def _map_arguments(self, inputs: list[ConfigTensor], names: list[str], label: str) -> None:
        """Which of ``forward``'s arguments each input (and control, and state) goes to."""
        arguments = _arguments(self.module, label)
        self.argument_count = len(arguments)
        self.input_map = map_inputs(self.name, names, arguments)
        check_indices(self.name, "input", self.input_map, len(arguments))
        check_argument_types(self.name, inputs, self.input_map, arguments)

    def _warn_config_order(self) -> None:
        for kind, mapping in (("input", self.input_map), ("output", self.output_map)):
            if mapping.convention is Convention.CONFIG_ORDER and len(mapping.index) > 1:
                pb_utils.Logger.log_warn(
                    f"model '{self.name}': the {kind}s are neither forward() argument names nor "
                    "<name>__<index>: they are taken in the order of the configuration"
                )

    def finalize(self) -> None:
        self.module = None
        if self.torch is not None and self.device is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    # -- execute ----------------------------------------------------------------------------

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        return self.batching.execute(requests, _feed, self._run)

    def _run(self, names: list[str], feed: Feed) -> list[np.ndarray]:
        torch = self.torch
        call_args = self._call_arguments(feed)
        try:
            with self._grad_mode(), torch.jit.optimized_execution(self.options.optimized_execution):
                result = self.module(*call_args)
        except Exception as error:  # TorchScript raises torch.jit.Error, RuntimeError, ...
            raise TorchModelError(
                f"PyTorch execute failure: model '{self.name}': {_first_lines(error)}"
            ) from None
        finally:
            if self.options.cache_cleaning and self.device.type == "cuda":
                torch.cuda.empty_cache()
        values = self._results(result)
        return [self._output(name, values) for name in names]

    @contextlib.contextmanager
    def _grad_mode(self) -> Iterator[None]:
        mode = self.torch.inference_mode if self.options.inference_mode else self.torch.no_grad
        with mode():
            yield

    def _call_arguments(self, feed: Feed) -> list[Any]:
        values = {name: self._to_torch(name, array) for name, array in feed.items()}
        if self.input_map.convention is Convention.DICTIONARY:
            return [values]
        arguments: list[Any] = [None] * self.argument_count
        for name, value in values.items():
            index = self.input_map.index.get(name)
            if index is None:
                raise TorchModelError(f"model '{self.name}' has no input '{name}'")
            arguments[index] = value
        missing = [n for n, i in self.input_map.index.items() if arguments[i] is None]
        if missing:
            raise TorchModelError(
                f"model '{self.name}' needs input(s) {', '.join(repr(m) for m in missing)}: "
                "every forward() argument must be given"
            )
        return arguments

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        if array.dtype.kind == "O":
            return strings_in(name, array)
        spec = self.inputs.get(name)
        if spec is not None and spec.datatype == "BF16":
            tensor = self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        else:
            tensor = self.torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _results(self, result: Any) -> list[Any]:
        """forward()'s result as a list: a tuple (or a list of tensors) is several outputs, a
        Tensor or a List[str] one."""
        if isinstance(result, tuple):
            return list(result)
        if (
            isinstance(result, list)
            and result
            and all(isinstance(r, self.torch.Tensor) for r in result)
        ):
            return result
        if isinstance(result, (list, self.torch.Tensor)):
            return [result]
        raise TorchModelError(
            f"model '{self.name}' returned {type(result).__name__}: forward() must return a "
            "Tensor, a List[str], or a tuple of them"
        )

    def _output(self, name: str, values: list[Any]) -> np.ndarray:
        index = self.output_map.index[name]
        if index >= len(values):
            raise TorchModelError(
                f"model '{self.name}' returned {len(values)} output(s), but output '{name}' is "
                f"number {index} ({self.output_map.convention.value})"
            )
        value = values[index]
        spec = self.outputs.get(name)
        if isinstance(value, list):
            self._check_type(name, spec, "BYTES", "List[str]")
            return strings_out(value)
        if not isinstance(value, self.torch.Tensor):
            raise TorchModelError(
                f"output '{name}' of model '{self.name}' is a {type(value).__name__}, not a "
                "Tensor or a List[str]"
            )
        got = V2_DATATYPES.get(str(value.dtype).removeprefix("torch."))
        self._check_type(name, spec, got, str(value.dtype))
        value = value.detach().cpu().contiguous()
        if got == "BF16":
            return np.asarray(value.view(self.torch.int16).numpy().view(np.uint16))
        return np.asarray(value.numpy())

    def _check_type(self, name: str, spec: ConfigTensor | None, got: str | None, raw: str) -> None:
        if spec is not None and spec.datatype != got:
            provides = config_type(got) if got is not None else raw
            raise TorchModelError(
                f"model '{self.name}': configuration expects datatype "
                f"{config_type(spec.datatype)} for output '{name}', model provides {provides}"
            )


def _feed(request: Any) -> Feed:
    return {tensor.name(): tensor._array() for tensor in request.inputs()}


def _scalar_outputs(outputs: list[ConfigTensor], max_batch_size: int) -> frozenset[str]:
    if max_batch_size > 0:
        return frozenset()
    return frozenset(t.name for t in outputs if t.dims == (1,) and not t.has_reshape)


def _device(torch: Any, args: Mapping[str, str], label: str) -> Any:
    """``cuda:<device id>`` for a GPU instance (tests/gpu/test_torch_gpu.py), else the CPU."""
    if args.get("model_instance_kind") != "GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TorchModelError(
            f"unable to load model {label}: the instance is KIND_GPU, but this torch "
            f"({torch.__version__}) sees no CUDA device: use KIND_CPU or a CUDA build of torch"
        )
    device = torch.device("cuda", int(args.get("model_instance_device_id", "0") or 0))
    torch.cuda.set_device(device)
    return device


def _load(torch: Any, model_file: str, device: Any, label: str) -> Any:
    try:
        module = torch.jit.load(model_file, map_location=device)
    except Exception as error:  # RuntimeError, or anything a corrupt archive raises
        raise TorchModelError(
            f"unable to load model {label}: '{model_file}' is not a TorchScript model that this "
            f"torch ({torch.__version__}) can load: {_first_lines(error)} (save the model with "
            "torch.jit.save(torch.jit.script(model), ...) or torch.jit.trace; pickles from "
            "torch.save and torch.export archives are not TorchScript)"
        ) from None
    module.eval()
    return module


def _arguments(module: Any, label: str) -> list[Argument]:
    """forward()'s arguments, without ``self``."""
    try:
        schema = module.forward.schema
    except AttributeError:
        raise TorchModelError(
            f"unable to load model {label}: the TorchScript module has no forward() method"
        ) from None
    arguments = [Argument(a.name, a.type.kind(), str(a.type)) for a in schema.arguments]
    if arguments and arguments[0].kind == "ClassType":
        arguments = arguments[1:]
    return arguments


def _first_lines(error: BaseException, count: int = 6) -> str:
    """TorchScript errors carry long tracebacks of the scripted code: keep the start."""
    lines = str(error).strip().splitlines()
    text = "\n".join(lines[:count])
    return text + ("\n..." if len(lines) > count else "")


__all__ = ["TorchScriptModel", "create_model"]
