"""What the per-request checks read of a model's configuration, built once per model version.

:class:`~shoal.config.ModelConfig` and its :class:`~shoal.config.TensorConfig` are frozen
dataclasses that mypyc does not compile: every attribute the checks read of them per request is
a generic lookup in CPython, and the checks built a dict of the inputs by name and a list of
the required ones on every request. A :class:`ModelSummary` holds the same facts in native
attributes (this module is compiled), with those tables made once, when the version loads.
"""

from __future__ import annotations

from shoal.config import ModelConfig, TensorConfig


class InputRule:
    """One configured input, as the checks and the staging read it."""

    def __init__(self, tensor: TensorConfig, max_batch_size: int) -> None:
        self.name: str = tensor.name
        self.datatype: str = tensor.datatype
        self.optional: bool = tensor.optional
        #: The shape a request must have: the configured dims, after a -1 for the batch
        #: dimension when the model batches.
        self.expected: tuple[int, ...] = (
            (-1, *tensor.dims) if max_batch_size > 0 else tuple(tensor.dims)
        )
        #: The shape the model sees instead of the configured dims (None: no reshape).
        self.reshape: tuple[int, ...] | None = (
            None if tensor.reshape is None else tuple(tensor.reshape)
        )


class ModelSummary:
    """A model version's inputs and outputs as the per-request checks need them."""

    def __init__(self, config: ModelConfig) -> None:
        self.name: str = config.name
        self.max_batch_size: int = config.max_batch_size
        #: Inputs by name, in the configuration's order.
        self.inputs: dict[str, InputRule] = {
            t.name: InputRule(t, config.max_batch_size) for t in config.inputs
        }
        #: The names of the inputs a request must give, in the configuration's order.
        self.required: list[str] = [t.name for t in config.inputs if not t.optional]
        #: Every output name, in the configuration's order (what a request naming none gets).
        self.outputs: list[str] = [t.name for t in config.outputs]
        self.output_names: frozenset[str] = frozenset(self.outputs)
