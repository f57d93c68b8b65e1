"""The timestamps of a traced request, from the times the core measures for its statistics.

Triton's Python backend times compute around its IPC in the parent process; so does shoal's
core, from the same clock as Triton's steady clock (CLOCK_MONOTONIC, which the stubs read
too): the queue ends when the stub starts the batch (a request sent ahead waits in the stub's
ring), the stub's three compute durations follow, and compute ends when the core reads the
stub's Result (docs/statistics.md says where each statistic starts and stops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.ipc.records import RequestRecord
from shoal.supervisor.extensions.trace_files import Trace
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.requests.traced_tensors import Viewer, trace_inputs, trace_outputs
from shoal.supervisor.work import Completion, Work

if TYPE_CHECKING:
    from shoal.supervisor.models.version import ModelVersion


def begin(
    tracing: TraceSettings, mv: ModelVersion, record: RequestRecord, started: int
) -> Trace | None:
    """The trace of a request that started at ``started`` and is queued now, if it was
    sampled with a trace file (None: no trace is written)."""
    if not record.trace_context:
        return None
    trace = tracing.begin(record.trace_context, mv.name, mv.version, record.request_id)
    if trace is not None:
        trace.stamp("REQUEST_START", started)
        trace.stamp("QUEUE_START")
    return trace


def end(trace: Trace | None) -> None:
    """A request that :func:`begin` traced is over."""
    if trace is not None:
        trace.stamp("REQUEST_END")
        trace.finish()


def submitted(
    tracing: TraceSettings, mv: ModelVersion, work: Work, started: int, view: Viewer
) -> None:
    """A sampled request's ``work`` was made: its trace follows the work to its answer;
    ``view`` reads its inputs' blocks."""
    trace = begin(tracing, mv, work.record, started)
    if trace is not None:
        follow(trace, work, view)


def bls_call(tracing: TraceSettings, target: ModelVersion, work: Work, view: Viewer) -> None:
    """A BLS call made with its caller's trace (``trace=request.trace()``): a child trace of
    the caller's while that one runs, as in Triton (a decoupled call's is not written)."""
    parent = tracing.running(work.record.trace_context)
    if parent is None or work.stream is not None:
        return
    trace = parent.child(target.name, target.version, work.record.request_id)
    trace.stamp("REQUEST_START", work.enqueued_ns)
    trace.stamp("QUEUE_START", work.enqueued_ns)
    follow(trace, work, view)


def follow(trace: Trace, work: Work, view: Viewer) -> None:
    """Trace a queued request's inputs (level TENSORS); stamp its compute and end (and trace
    its outputs) once its work is answered, and finish its trace."""
    if trace.tensors:
        trace_inputs(trace, work.record, view)
    work.future.add_done_callback(_Answered(trace, work))


def stamp_compute(trace: Trace, work: Work, completion: Completion) -> None:
    """The compute timestamps of a request answered with ``completion``."""
    start = work.enqueued_ns + completion.queue_ns
    compute_input, compute_infer, compute_output = completion.compute_ns
    trace.stamp("COMPUTE_START", start)
    trace.stamp("COMPUTE_INPUT_END", start + compute_input)
    output_start = start + compute_input + compute_infer
    trace.stamp("COMPUTE_OUTPUT_START", output_start)
    trace.stamp("COMPUTE_END", max(completion.received_ns, output_start + compute_output))


class _Answered:
    """A traced work's done callback (a Future's or a Promise's)."""

    def __init__(self, trace: Trace, work: Work) -> None:
        self.trace = trace
        self.work = work

    def __call__(self, future: Any) -> None:
        trace = self.trace
        if not future.cancelled() and future.exception() is None:
            completion: Completion = future.result()
            stamp_compute(trace, self.work, completion)
            if trace.tensors and completion.response.error is None:
                trace_outputs(trace, completion.response, completion.view)
            trace.stamp("INFER_RESPONSE_COMPLETE")
        trace.stamp("REQUEST_END")
        trace.finish()


__all__ = ["begin", "bls_call", "end", "follow", "stamp_compute", "submitted"]
