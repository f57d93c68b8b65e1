"""What the per-request checks read of a model's configuration, built once per model version.

:class:`~shoal.config.ModelConfig` and its :class:`~shoal.config.TensorConfig` are frozen
dataclasses that mypyc does not compile: every attribute the checks read of them per request is
a generic lookup in CPython, and the checks built a dict of the inputs by name and a list of
the required ones on every request. A :class:`ModelSummary` holds the same facts in native
attributes (this module is compiled), with those tables made once, when the version loads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from shoal.config import ModelConfig, TensorConfig
from shoal.core.packed import reshape_sources
from shoal.ipc.tensor import inline_budget

#: Each summary's number, unique in the process: a frontend worker's snapshot of a summary names
#: it, so a request checked against a model version since unloaded or reloaded is known stale.
_generations = itertools.count(1)


class InputRule:
    """One configured input, as the checks and the staging read it: ``expected`` is the shape a
    request must have (the dims, after a -1 for the batch dimension when the model batches),
    ``reshape`` the shape the model sees instead of the dims (None: no reshape)."""

    def __init__(self, tensor: TensorConfig, max_batch_size: int) -> None:
        self.name: str = tensor.name
        self.datatype: str = tensor.datatype
        self.optional: bool = tensor.optional
        self.expected: tuple[int, ...] = _batched(tensor.dims, max_batch_size)
        self.reshape: tuple[int, ...] | None = tensor.reshape
        #: Where the reshape's -1s take their values from (``core.packed.reshape_sources``).
        self.reshape_sources: tuple[int, ...] = reshape_sources(
            self.expected, self.reshape, max_batch_size > 0
        )


class ModelSummary:
    """A model version's inputs and outputs as the per-request checks need them: ``inputs``
    by name and ``required`` (the names a request must give) in the configuration's order,
    ``outputs`` every output name in order (what a request that names none gets)."""

    def __init__(self, config: ModelConfig) -> None:
        self.name: str = config.name
        self.max_batch_size: int = config.max_batch_size
        self.inputs: dict[str, InputRule] = _rules(config)
        self.required: list[str] = [t.name for t in config.inputs if not t.optional]
        self.outputs: list[str] = [t.name for t in config.outputs]
        self.output_names: frozenset[str] = frozenset(self.outputs)
        #: Bytes of a request's inputs that may travel inside its Execute (ipc/tensor.py).
        self.inline_budget: int = inline_budget(config.max_batch_size)
        #: Which load of the model this is (see ``_generations``).
        self.generation: int = next(_generations)


def _batched(dims: Sequence[int], max_batch_size: int) -> tuple[int, ...]:
    return (-1, *dims) if max_batch_size > 0 else tuple(dims)


def _rules(config: ModelConfig) -> dict[str, InputRule]:
    return {t.name: InputRule(t, config.max_batch_size) for t in config.inputs}
