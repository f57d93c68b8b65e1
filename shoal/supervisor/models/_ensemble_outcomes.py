"""What an ensemble's steps are sent, how an ensemble request's end is counted and how its
steps' errors are answered, for plain and streamed ensembles alike."""

from __future__ import annotations

import copy
import logging
from collections.abc import Container

from shoal.core.errors import ErrorCode, InvalidArgument, ModelError, ShoalError
from shoal.core.types import ParamValue
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.extensions.statistics import ComputeNs
from shoal.supervisor.models._ensemble_plan import StepPlan, input_datatypes
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests.staging import missing_inputs

log = logging.getLogger("shoal")

#: The request flags of a sequence's first and last requests.
_SEQUENCE_START = 1
_SEQUENCE_END = 2


def made_outputs(ensemble: str, wanted: list[str], tensors: Container[str]) -> list[str]:
    """The requested outputs that the steps made. As in Triton, one that no step made (a step
    model that left out an output it declares) is left out of the response, not an error."""
    for name in wanted:
        if name not in tensors:
            log.debug("Composing models did not output tensor %s (ensemble '%s')", name, ensemble)
    return [name for name in wanted if name in tensors]


def sequence_parameters(record: RequestRecord) -> dict[str, ParamValue]:
    """The parameters of an ensemble's response: as Triton's ensemble scheduler, the sequence id
    and flags of the step requests that made its outputs (the request's own)."""
    return {
        "sequence_id": record.correlation_id,
        "sequence_start": bool(record.flags & _SEQUENCE_START),
        "sequence_end": bool(record.flags & _SEQUENCE_END),
    }


class StepTimes:
    """The compute times of one ensemble request's steps, a nested ensemble's steps included:
    Triton reports their sums as the ensemble's own compute times."""

    __slots__ = ("infer_ns", "input_ns", "output_ns")

    def __init__(self) -> None:
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0

    def add(self, compute: ComputeNs) -> None:
        self.input_ns += compute[0]
        self.infer_ns += compute[1]
        self.output_ns += compute[2]

    def total(self) -> ComputeNs:
        return (self.input_ns, self.infer_ns, self.output_ns)


def count_success(target: ModelVersion, batch: int, elapsed: int, times: StepTimes) -> None:
    """An ensemble request answered: as in Triton, one execution of its batch size (at least 1)
    whose compute times are its steps' (clients read an ensemble's execution_count and
    batch_stats as a model's)."""
    compute = times.total()
    target.stats.execution(max(1, batch), compute)
    target.stats.success(batch, elapsed, 0, compute)


def count_failure(target: ModelVersion, elapsed: int, error: BaseException | None) -> None:
    if isinstance(error, ShoalError):
        target.stats.failure(elapsed, error.reason)


def step_error(ensemble: str, error: tuple[str, str]) -> ModelError:
    """A step model's error response, as the ensemble's error (its code kept)."""
    code, message = error
    return ModelError(
        f"in ensemble '{ensemble}', {message}", ErrorCode.__members__.get(code, ErrorCode.INTERNAL)
    )


def in_ensemble(ensemble: str, error: BaseException) -> BaseException:
    """A step's failure as the ensemble's, in Triton's words: "in ensemble 'e', " before the
    step's message (clients match it: "in ensemble 'e', inference request for sequence 7 to
    model 'm' must specify the START flag..."), the step's error class and code kept."""
    prefix = f"in ensemble '{ensemble}', "
    if not isinstance(error, ShoalError) or error.message.startswith(prefix):
        return error
    wrapped = copy.copy(error)
    wrapped.message = prefix + error.message
    wrapped.args = (wrapped.message,)
    return wrapped


def step_record(base: RequestRecord, step: StepPlan, inputs: list[TensorDesc]) -> RequestRecord:
    """The request of one step: the ensemble request's id, flags and parameters."""
    return RequestRecord(
        request_id=base.request_id,
        correlation_id=base.correlation_id,
        flags=base.flags,
        parameters=base.parameters,
        requested_outputs=list(step.requested),
        inputs=inputs,
        timeout_us=base.timeout_us,
    )


def step_inputs(
    ensemble: str,
    step: StepPlan,
    target: ModelVersion,
    tensors: dict[str, TensorDesc],
    request_id: str,
) -> list[TensorDesc]:
    """A step's inputs, read from the ensemble's ``tensors`` and checked against its model.

    As in Triton, a tensor that is not there (an optional input the client did not give, an
    output its step did not make) is left out of the step's request; the step fails only
    where its model requires that input."""
    inputs = []
    datatypes = input_datatypes(step, target)
    for (name, source_name), expected in zip(step.inputs, datatypes, strict=True):
        source = tensors.get(source_name)
        if source is None:
            continue
        if expected is None:
            raise InvalidArgument(
                f"ensemble '{ensemble}' maps tensor '{source_name}' to input '{name}', "
                f"which model '{target.name}' does not have"
            )
        if expected != source.datatype:
            raise InvalidArgument(
                f"ensemble '{ensemble}': tensor '{source_name}' is {source.datatype} "
                f"but input '{name}' of model '{target.name}' expects {expected}"
            )
        inputs.append(TensorDesc(name, source.datatype, source.shape, source.location))
    if len(inputs) < len(step.inputs):
        given = [t.name for t in inputs]
        if any(name not in given for name in target.summary.required):
            error = missing_inputs(target.summary, request_id, given)
            raise in_ensemble(ensemble, error)
    return inputs
