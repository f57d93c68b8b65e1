"""The inputs the sequence batcher adds to a request: control tensors and implicit state.

Control tensors (``CONTROL_SEQUENCE_START``/``END``/``READY``/``CORRID``) have shape ``[1]``, or
``[1, 1]`` for a model with ``max_batch_size > 0``, and are staged into the input arena: their
blocks join the request's ``input_blocks`` and are freed with it.

Implicit state: the scheduler keeps each slot's latest state bytes. A request gets them as the
state's ``input_name`` input (the initial state on START), asks for ``output_name`` as an output,
and the completion hook copies that output back into the slot's state and removes it from the
response unless the client asked for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shoal.config import ModelConfig
from shoal.config import SequenceState as StateConfig
from shoal.ipc.arena import Block
from shoal.ipc.dtypes import NUMPY_DTYPES, byte_size, element_count
from shoal.ipc.tensor import CudaLocation, InlineBytes
from shoal.supervisor.schedulers._batching import sequence_settings
from shoal.supervisor.schedulers.base import StageTensor
from shoal.supervisor.work import Completion, Work

#: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END.
FLAG_START = 1
FLAG_END = 2


class SchedulerConfigError(Exception):
    """The configuration cannot be scheduled (e.g. an initial-state file is missing): the model
    fails to load with this message."""


@dataclass(frozen=True)
class StateValue:
    """One state tensor: V2 datatype, shape (with the batch dimension) and raw bytes."""

    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(eq=False)
class SequenceState:
    """The implicit state of the sequence in one slot, by state input name."""

    values: dict[str, StateValue] = field(default_factory=dict)


class SequenceTensors:
    """Builds and stages the control and state inputs of one model's requests."""

    def __init__(self, config: ModelConfig, stage: StageTensor) -> None:
        batching = sequence_settings(config)
        self._stage = stage
        self._batched = config.max_batch_size > 0
        self._controls = batching.controls
        self._states = batching.states
        self._initial = {s.input_name: self._initial_value(config, s) for s in self._states}
        self._state_inputs = {s.output_name: s.input_name for s in self._states}
        corrid = batching.control("CONTROL_SEQUENCE_CORRID")
        self.corrid_datatype = corrid.datatype if corrid is not None else None
        self._corrid_name = corrid.tensor_name if corrid is not None else ""

    # -- controls ---------------------------------------------------------------------------

    def add_controls(self, work: Work, *, ready: bool = True) -> None:
        """Stage this request's control tensors; a not-ready (null) request gets all false."""
        flags = work.record.flags if ready else 0
        truth = {
            "CONTROL_SEQUENCE_START": bool(flags & FLAG_START),
            "CONTROL_SEQUENCE_END": bool(flags & FLAG_END),
            "CONTROL_SEQUENCE_READY": ready,
        }
        shape = (1, 1) if self._batched else (1,)
        for control in self._controls:
            if control.kind == "CONTROL_SEQUENCE_CORRID":
                corr = work.record.correlation_id if ready else 0
                array = _corrid_array(control.datatype, corr)
            else:
                value = control.true_value if truth[control.kind] else control.false_value
                array = np.array(value, dtype=NUMPY_DTYPES[control.datatype])
            self._add(work, control.tensor_name, control.datatype, shape, array.reshape(shape))

    def stage_zeros(self, nbytes: int) -> Block:
        """A zero-filled input-arena block (the data of a null request)."""
        return self._stage("", "UINT8", (nbytes,), bytes(nbytes))[1]

    def corrid_mismatch(self, corr: int | str, model: str) -> str | None:
        """Why ``corr`` cannot be the CORRID control's value, in Triton's rule and words: a
        string id needs a TYPE_STRING control, a numeric id an integer one."""
        expected = self.corrid_datatype
        if expected is None:
            return None
        given = "BYTES" if isinstance(corr, str) else "UINT64"
        if expected in (("BYTES",) if given == "BYTES" else _INTEGER_CORRIDS):
            return None
        return (
            f"sequence batching control '{self._corrid_name}' data-type is '{given}', but "
            f"model '{model}' expects '{expected}'"
        )

    # -- implicit state ---------------------------------------------------------------------

    @property
    def has_state(self) -> bool:
        return bool(self._states)

    def add_state(self, work: Work, state: SequenceState | None) -> None:
        """Stage the slot's state (the initial state on START); ``None``: a dummy state."""
        if not self._states:
            return
        if state is None:
            values = self._initial
        else:
            if work.record.flags & FLAG_START or not state.values:
                state.values = dict(self._initial)
            values = state.values
        for spec in self._states:
            value = values[spec.input_name]
            self._add(work, spec.input_name, value.datatype, value.shape, value.data)
        requested = work.record.requested_outputs
        hidden = {name for name in self._state_inputs if name not in requested}
        work.record.requested_outputs = [*requested, *sorted(hidden)]
        work.on_complete = functools.partial(self._capture, state, hidden)

    def _capture(self, state: SequenceState | None, hidden: set[str], done: Completion) -> None:
        response = done.response
        if response.error is not None:
            return
        for output in response.outputs:
            input_name = self._state_inputs.get(output.name)
            # A GPU state output is kept as host bytes too (one copy), like a CPU one.
            location = output.location
            if state is None or not input_name:
                continue
            if isinstance(location, InlineBytes):
                data = location.data
            elif isinstance(location, Block | CudaLocation):
                data = bytes(done.view(location))
            else:
                continue
            state.values[input_name] = StateValue(output.datatype, output.shape, data)
        if hidden:
            hide_outputs(done, hidden)

    def _initial_value(self, config: ModelConfig, spec: StateConfig) -> StateValue:
        batch = (1,) if self._batched else ()
        if not spec.initial_states:
            dims = tuple(1 if d == -1 else d for d in spec.dims)
            return StateValue(spec.datatype, batch + dims, _zeros(spec.datatype, dims))
        initial = spec.initial_states[0]
        dims = tuple(initial.dims)
        if initial.zero_data or initial.data_file is None:
            return StateValue(initial.datatype, batch + dims, _zeros(initial.datatype, dims))
        path = Path(config.path) / "initial_state" / initial.data_file
        try:
            data = path.read_bytes()
        except OSError as error:
            raise SchedulerConfigError(
                f"cannot read the initial state '{initial.name}' of state '{spec.input_name}' "
                f"from {path}: {error.strerror}"
            ) from None
        expected = byte_size(initial.datatype, dims)
        if expected is not None and len(data) != expected:
            raise SchedulerConfigError(
                f"the initial state file {path} holds {len(data)} bytes but "
                f"{initial.datatype} dims {list(dims)} need {expected}"
            )
        return StateValue(initial.datatype, batch + dims, data)

    def _add(self, work: Work, name: str, datatype: str, shape: tuple[int, ...], data: Any) -> None:
        desc, block = self._stage(name, datatype, shape, data)
        work.input_blocks.append(block)
        work.record.inputs.append(desc)


def hide_outputs(done: Completion, names: set[str]) -> None:
    """Remove outputs from a response and release the blocks no remaining output uses."""
    response = done.response
    kept = [o for o in response.outputs if o.name not in names]
    dropped = {o.location for o in response.outputs if o.name in names}
    used = {o.location for o in kept}
    release = [b for b in done.owned if b in dropped and b not in used]
    response.outputs = kept
    if release:
        done.owned = [b for b in done.owned if b not in release]
        done.instance.release_outputs(done.process, release)


def _zeros(datatype: str, dims: tuple[int, ...]) -> bytes:
    size = byte_size(datatype, dims)
    # BYTES: every element an empty string (a zero 4-byte length).
    return bytes(4 * element_count(dims) if size is None else size)


#: The CORRID control datatypes that take a numeric correlation id (Triton's).
_INTEGER_CORRIDS = ("UINT64", "INT64", "UINT32", "INT32")


def _corrid_array(datatype: str, corr: int | str) -> np.ndarray:
    if datatype == "BYTES":
        text = corr if isinstance(corr, str) else str(corr)
        return np.array([text.encode()], dtype=np.object_)
    return np.array([corr], dtype=NUMPY_DTYPES[datatype])
