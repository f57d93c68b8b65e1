"""Typed view of ``sequence_batching``: strategy, control tensors and implicit state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shoal.protos import model_config_pb2 as pb

from .datatypes import config_dtype_to_v2

_Control = pb.ModelSequenceBatching.Control
ControlValue = bool | int | float


@dataclass(frozen=True)
class SequenceControl:
    """A control the sequence batcher writes into the model input ``tensor_name``.

    ``kind`` is ``CONTROL_SEQUENCE_START``, ``_END``, ``_READY`` or ``_CORRID``. Boolean
    controls carry the values to write for false and true; a CORRID control carries the
    request's correlation id in ``datatype``.
    """

    kind: str
    tensor_name: str
    datatype: str  # KServe V2 name
    false_value: ControlValue | None = None
    true_value: ControlValue | None = None


@dataclass(frozen=True)
class SequenceInitialState:
    name: str
    datatype: str
    dims: tuple[int, ...]
    zero_data: bool
    data_file: str | None


@dataclass(frozen=True)
class SequenceState:
    """Implicit state: the model's ``output_name`` output becomes its next ``input_name`` input."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial_states: tuple[SequenceInitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False


@dataclass(frozen=True)
class SequenceBatchingConfig:
    """``strategy`` is ``direct`` unless the configuration chooses ``oldest``.

    ``max_queue_delay_microseconds`` and ``preserve_ordering`` come from the chosen strategy;
    ``minimum_slot_utilization`` applies to direct, ``max_candidate_sequences`` and
    ``preferred_batch_sizes`` to oldest.
    """

    strategy: Literal["direct", "oldest"]
    max_sequence_idle_microseconds: int
    controls: tuple[SequenceControl, ...]
    states: tuple[SequenceState, ...]
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    iterative_sequence: bool = False

    def control(self, kind: str) -> SequenceControl | None:
        """The control of ``kind`` (e.g. ``"CONTROL_SEQUENCE_START"``), or ``None``."""
        return next((control for control in self.controls if control.kind == kind), None)


def sequence_batching_from_proto(batching: pb.ModelSequenceBatching) -> SequenceBatchingConfig:
    oldest = batching.oldest if batching.HasField("oldest") else None
    strategy = oldest if oldest is not None else batching.direct
    return SequenceBatchingConfig(
        strategy="direct" if oldest is None else "oldest",
        max_sequence_idle_microseconds=batching.max_sequence_idle_microseconds,
        controls=tuple(
            _control(control_input.name, control)
            for control_input in batching.control_input
            for control in control_input.control
        ),
        states=tuple(_state(state) for state in batching.state),
        max_queue_delay_microseconds=strategy.max_queue_delay_microseconds,
        minimum_slot_utilization=batching.direct.minimum_slot_utilization,
        max_candidate_sequences=0 if oldest is None else oldest.max_candidate_sequences,
        preferred_batch_sizes=() if oldest is None else tuple(oldest.preferred_batch_size),
        preserve_ordering=oldest is not None and oldest.preserve_ordering,
        iterative_sequence=batching.iterative_sequence,
    )


def _control(tensor_name: str, control: pb.ModelSequenceBatching.Control) -> SequenceControl:
    kind = _Control.Kind.Name(control.kind)
    if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
        return SequenceControl(kind, tensor_name, config_dtype_to_v2(control.data_type))
    datatype, values = _false_true(control)
    return SequenceControl(kind, tensor_name, datatype, values[0], values[1])


def _false_true(control: pb.ModelSequenceBatching.Control) -> tuple[str, list[ControlValue]]:
    """The datatype of a control's false and true values, and the values."""
    if control.int32_false_true:
        return "INT32", list(control.int32_false_true)
    if control.fp32_false_true:
        return "FP32", list(control.fp32_false_true)
    return "BOOL", list(control.bool_false_true)


def _state(state: pb.ModelSequenceBatching.State) -> SequenceState:
    return SequenceState(
        input_name=state.input_name,
        output_name=state.output_name,
        datatype=config_dtype_to_v2(state.data_type),
        dims=tuple(state.dims),
        initial_states=tuple(
            SequenceInitialState(
                name=initial.name,
                datatype=config_dtype_to_v2(initial.data_type),
                dims=tuple(initial.dims),
                zero_data=initial.zero_data,
                data_file=initial.data_file if initial.HasField("data_file") else None,
            )
            for initial in state.initial_state
        ),
        use_same_buffer_for_input_output=state.use_same_buffer_for_input_output,
        use_growable_memory=state.use_growable_memory,
    )


__all__ = [
    "SequenceBatchingConfig",
    "SequenceControl",
    "SequenceInitialState",
    "SequenceState",
    "sequence_batching_from_proto",
]
