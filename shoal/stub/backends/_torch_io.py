"""Tensors between shoal and a TorchScript module: naming conventions, datatypes, strings.

Nothing here imports torch: ``forward()``'s arguments come in as :class:`Argument` (name and
TorchScript type kind), so the rules are testable alone. They follow Triton's PyTorch backend:

* **Inputs** map to ``forward()`` arguments by the first convention every configured input
  name fits: the argument's name (``forward(self, x, y)`` takes inputs ``x`` and ``y``);
  ``<name>__<index>`` (``INPUT__0`` is the first argument); otherwise the order of the
  configuration. A ``forward`` with a single ``Dict[str, Tensor]`` argument gets every input
  in one dictionary, keyed by input name.
* **Outputs** map to the elements of what ``forward()`` returns (a tensor is one element, a
  tuple many) by ``<name>__<index>``, otherwise by the order of the configuration.
* ``TYPE_STRING`` tensors are ``List[str]`` for the model, so they have one dimension in all
  (batch dimension included).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from shoal.stub.backends._config import BackendModelError, ConfigTensor, config_type

#: V2 datatype -> name of the torch dtype (an attribute of the ``torch`` module). BF16 travels
#: as 16-bit words (shoal's NumPy form) and is reinterpreted on each side.
TORCH_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
}
#: torch dtype name -> V2 datatype, for checking what the model returns.
V2_DATATYPES: dict[str, str] = {torch: v2 for v2, torch in TORCH_DTYPES.items()}

_NAMED_INDEX = re.compile(r"^.*__(\d+)$")


class TorchModelError(BackendModelError):
    """The TorchScript model cannot be loaded or run as configured."""


class Convention(enum.Enum):
    """How configured tensors map to ``forward()``'s arguments or results."""

    FORWARD_ARGUMENT = "forward() argument names"
    NAMED_INDEX = "<name>__<index>"
    CONFIG_ORDER = "configuration order"
    DICTIONARY = "one Dict[str, Tensor] argument"


@dataclass(frozen=True)
class Argument:
    """An argument of ``forward()``; ``kind`` is TorchScript's type kind (``TensorType``,
    ``ListType``, ``DictType``, ...) and ``type`` its text (``List[str]``)."""

    name: str
    kind: str
    type: str = ""


@dataclass(frozen=True)
class TensorMap:
    """Where each configured name goes: an argument or result index, or a dictionary key."""

    convention: Convention
    index: dict[str, int]


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name, else ``None``."""
    match = _NAMED_INDEX.match(name)
    return int(match.group(1)) if match else None


def map_inputs(model: str, names: Sequence[str], arguments: Sequence[Argument]) -> TensorMap:
    """The argument each input name goes to; raises :class:`TorchModelError` when the model's
    ``forward()`` cannot take the configured inputs."""
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        return TensorMap(Convention.DICTIONARY, {name: i for i, name in enumerate(names)})
    for argument in arguments:
        if argument.kind not in ("TensorType", "ListType"):
            raise TorchModelError(
                f"unable to load model '{model}': forward() argument '{argument.name}' has type "
                f"{argument.type or argument.kind}; only Tensor and List[str] arguments, or a "
                "single Dict[str, Tensor] argument, can be served"
            )
    if len(arguments) != len(names):
        raise TorchModelError(
            f"unable to load model '{model}', configuration expects {len(names)} inputs, model "
            f"provides {len(arguments)} (forward() takes "
            f"{', '.join(a.name for a in arguments) or 'none'}; configured: {', '.join(names)})"
        )
    by_name = [a.name for a in arguments]
    if all(name in by_name for name in names):
        return TensorMap(Convention.FORWARD_ARGUMENT, {n: by_name.index(n) for n in names})
    return _by_index_or_order(model, "input", names)


def map_outputs(model: str, names: Sequence[str]) -> TensorMap:
    """The element of ``forward()``'s result each output name is."""
    return _by_index_or_order(model, "output", names)


def _by_index_or_order(model: str, kind: str, names: Sequence[str]) -> TensorMap:
    indices = {name: named_index(name) for name in names}
    if all(index is not None for index in indices.values()):
        found = {name: int(index) for name, index in indices.items() if index is not None}
        _check_distinct(model, kind, found)
        return TensorMap(Convention.NAMED_INDEX, found)
    return TensorMap(Convention.CONFIG_ORDER, {name: i for i, name in enumerate(names)})


def _check_distinct(model: str, kind: str, index: dict[str, int]) -> None:
    seen: dict[int, str] = {}
    for name, position in index.items():
        if position in seen:
            raise TorchModelError(
                f"unable to load model '{model}': {kind}s '{seen[position]}' and '{name}' both "
                f"have index {position} in the <name>__<index> naming convention"
            )
        seen[position] = name


def check_datatypes(model: str, kind: str, tensors: Iterable[ConfigTensor]) -> None:
    """Every datatype must have a torch dtype, or be ``TYPE_STRING``."""
    for tensor in tensors:
        if tensor.datatype != "BYTES" and tensor.datatype not in TORCH_DTYPES:
            raise TorchModelError(
                f"unable to load model '{model}': unsupported datatype "
                f"{config_type(tensor.datatype)} for {kind} '{tensor.name}' (PyTorch has no such "
                "tensor type)"
            )


def check_strings(
    model: str, kind: str, tensors: Iterable[ConfigTensor], max_batch_size: int
) -> None:
    """``TYPE_STRING`` tensors reach the model as ``List[str]``: one dimension in all."""
    for tensor in tensors:
        if tensor.datatype != "BYTES":
            continue
        rank = len(tensor.model_dims) + (1 if max_batch_size > 0 else 0)
        if rank > 1:
            hint = "dims: [ 1 ] with reshape: { shape: [ ] }" if max_batch_size > 0 else "dims"
            raise TorchModelError(
                f"unable to load model '{model}': {kind} '{tensor.name}' is TYPE_STRING with "
                f"{rank} dimensions; PyTorch models take and give strings as a 1-dimensional "
                f"List[str] only (batch dimension included): use {hint} of one dimension"
            )


def check_argument_types(
    model: str, inputs: Sequence[ConfigTensor], mapping: TensorMap, arguments: Sequence[Argument]
) -> None:
    """A ``TYPE_STRING`` input needs a ``List[str]`` argument, a tensor input a Tensor one."""
    if mapping.convention is Convention.DICTIONARY:
        return
    for tensor in inputs:
        index = mapping.index.get(tensor.name)
        if index is None or index >= len(arguments):
            continue
        argument = arguments[index]
        wants_list = tensor.datatype == "BYTES"
        if wants_list != (argument.kind == "ListType"):
            expected = "List[str]" if wants_list else "Tensor"
            raise TorchModelError(
                f"unable to load model '{model}': input '{tensor.name}' "
                f"({config_type(tensor.datatype)}) goes to forward() argument "
                f"'{argument.name}' ({mapping.convention.value}), which has type "
                f"{argument.type or argument.kind}, not {expected}"
            )


def check_indices(model: str, kind: str, mapping: TensorMap, count: int) -> None:
    """Every index of a ``<name>__<index>`` mapping must be below ``count``."""
    if mapping.convention is Convention.DICTIONARY:
        return
    for name, index in mapping.index.items():
        if index >= count:
            raise TorchModelError(
                f"unable to load model '{model}': {kind} '{name}' has index {index}, but "
                f"forward() takes {count} arguments"
            )


# -- strings ----------------------------------------------------------------------------------


def strings_in(name: str, array: np.ndarray) -> list[str]:
    """A BYTES input as the ``List[str]`` a TorchScript model takes (UTF-8 text)."""
    try:
        return [
            item.decode("utf-8") if isinstance(item, bytes) else str(item)
            for item in array.reshape(-1)
        ]
    except UnicodeDecodeError as error:
        raise TorchModelError(
            f"input '{name}' holds bytes that are not UTF-8 text ({error.reason} at byte "
            f"{error.start}): TorchScript strings are text"
        ) from None


def strings_out(items: Sequence[str | bytes]) -> np.ndarray:
    """A ``List[str]`` result as a BYTES output (``bytes`` elements)."""
    out = np.empty(len(items), dtype=np.object_)
    out[:] = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in items]
    return out


__all__ = [
    "TORCH_DTYPES",
    "V2_DATATYPES",
    "Argument",
    "Convention",
    "TensorMap",
    "TorchModelError",
    "check_argument_types",
    "check_datatypes",
    "check_indices",
    "check_strings",
    "map_inputs",
    "map_outputs",
    "named_index",
    "strings_in",
    "strings_out",
]
