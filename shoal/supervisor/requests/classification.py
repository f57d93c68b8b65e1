"""Triton's classification extension: an output asked for with ``classification: N`` comes back
as its N highest elements instead of its data.

The returned output is BYTES, each element ``"<value>:<index>"`` or ``"<value>:<index>:<label>"``
(the label from the output's ``label_filename`` in the model directory, one per line), highest
value first, equal values in index order. A model with ``max_batch_size > 0`` is classified per
batch item, shape ``[batch, N]``; any other model over all its elements, shape ``[N]``. ``N`` is
cut to the number of elements there are. Values print as C++ ``std::to_string`` prints them
(``"11.000000"`` for floats, ``"3"`` for integers), which is what Triton's clients parse.

Triton 2.51 crashes when asked to classify a BYTES output; shoal refuses the request in the
words of Triton's later versions, which refuse it too, as they refuse an output of more than a
million elements.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from shoal.config import ModelConfig
from shoal.core.errors import InvalidArgument, ShoalError
from shoal.core.types import InferOutput, InferRequest, InferResponse
from shoal.ipc.tensor import buffer_to_numpy

PARAMETER = "classification"

_LABELS: weakref.WeakKeyDictionary[ModelConfig, Mapping[str, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def requested(request: InferRequest, config: ModelConfig) -> dict[str, int]:
    """The outputs ``request`` asks to classify, with how many classes each; a count that is
    not an integer ≥ 0, or an output whose datatype has no order (BYTES), is refused."""
    counts: dict[str, int] = {}
    datatypes = {output.name: output.datatype for output in config.outputs}
    for output in request.outputs:
        value = output.parameters.get(PARAMETER)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(
                f"Unable to set 'classification' for output '{output.name}' of model "
                f"'{request.model_name}': expected a non-negative integer, got {value!r}"
            )
        if value:
            _refuse_unordered(output.name, datatypes.get(output.name, ""), config)
            counts[output.name] = value
    return counts


#: Triton's bound on the elements of an output it classifies (all batch items together).
MAX_ELEMENTS = 1_000_000


def _refuse_unordered(output: str, datatype: str, config: ModelConfig) -> None:
    if datatype == "BYTES":
        raise InvalidArgument(
            "class result not available for output due to unsupported type 'BYTES' (output "
            f"'{output}' of model '{config.name}')"
        )


def apply(response: InferResponse, config: ModelConfig, counts: Mapping[str, int]) -> None:
    """:func:`classify`; a response that cannot be classified gives its memory back first."""
    try:
        classify(response, config, counts)
    except ShoalError:
        response.release()
        raise


def classify(response: InferResponse, config: ModelConfig, counts: Mapping[str, int]) -> None:
    """Replace each output named in ``counts`` by its classification, in place."""
    labels = labels_of(config)
    batched = config.max_batch_size > 0
    for position, output in enumerate(response.outputs):
        count = counts.get(output.name)
        if count is None:
            continue
        _refuse_unordered(output.name, output.datatype, config)  # what the model returned
        values = buffer_to_numpy(output.datatype, output.shape, output.data)
        if values.size > MAX_ELEMENTS:
            raise InvalidArgument(
                f"classification output tensor too large (output '{output.name}' of model "
                f"'{config.name}' has {values.size} elements; at most {MAX_ELEMENTS} are "
                "classified)"
            )
        rows = values.reshape(values.shape[0] if batched and values.ndim else 1, -1)
        top = min(count, rows.shape[1])
        texts = [
            text
            for row in rows
            for text in _top(row, top, output.datatype, labels.get(output.name, ()))
        ]
        shape = (rows.shape[0], top) if batched and values.ndim else (top,)
        response.outputs[position] = InferOutput(
            output.name, "BYTES", shape, memoryview(_bytes_tensor(texts)), dict(output.parameters)
        )


def _top(row: np.ndarray, count: int, datatype: str, labels: Sequence[str]) -> list[str]:
    # Descending and stable: a stable ascending sort of the reversed row, read backwards, puts
    # equal values in index order (and works for unsigned types, which cannot be negated).
    order = np.argsort(row[::-1], kind="stable")[::-1][:count]
    last = len(row) - 1
    return [_class_text(row, last - int(r), datatype, labels) for r in order]


def _class_text(row: np.ndarray, index: int, datatype: str, labels: Sequence[str]) -> str:
    """``<value>:<index>[:<label>]``, as Triton writes a class."""
    text = f"{_value_text(row[index], datatype)}:{index}"
    if index < len(labels) and labels[index]:
        text += f":{labels[index]}"
    return text


def _value_text(value: np.generic, datatype: str) -> str:
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        return f"{float(value):f}"
    return str(int(value))


def _bytes_tensor(texts: list[str]) -> bytes:
    """``texts`` in the V2 binary BYTES layout (4-byte little-endian length, then the bytes)."""
    parts = []
    for text in texts:
        data = text.encode()
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def labels_of(config: ModelConfig) -> Mapping[str, tuple[str, ...]]:
    """Each output's labels from its ``label_filename`` (read once per loaded configuration).

    A label file that cannot be read fails the model's load (``ShoalError``), as in Triton.
    """
    known = _LABELS.get(config)
    if known is not None:
        return known
    labels: dict[str, tuple[str, ...]] = {}
    for output in config.proto.output:
        if not output.label_filename:
            continue
        path = Path(config.path) / output.label_filename
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ShoalError(
                f"model '{config.name}': cannot read the label file '{output.label_filename}' "
                f"of output '{output.name}' ({path}): {error}"
            ) from None
        labels[output.name] = tuple(text.splitlines())
    _LABELS[config] = labels
    return labels
