"""The core's side of the relay: requests a frontend worker checked, staged and packed.

A worker asks once per model version for the snapshot of its summary (:func:`snapshot`), checks
each request against it, stages every input itself (inline bytes, or blocks of its own arena)
and sends the request's wire record already packed, up to ``timeout_us``
(``frontends/workers/packing.py``). The core reads only what it schedules with
(:class:`~shoal.core.packed.PackedCall`) and splices the packed bytes into the Execute
(``messages.encode``).
A model the relay does not fit (an ensemble, a decoupled model, a batcher that forms or
routes batches from the requests' inputs, the response cache) has no snapshot, and its
requests take the core's own path; so does a request whose snapshot is stale (the model was
reloaded: its summary's ``generation`` changed), which the worker then sends again that way.
"""

from __future__ import annotations

from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.packed import PackedCall
from shoal.ipc.records import RequestRecord
from shoal.supervisor.drain import DrainGate
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.requests.summary import ModelSummary
from shoal.supervisor.schedulers.default import DefaultScheduler

#: The classes a packed request asks for: none (a worker packs no request that asks).
NO_CLASSES: dict[str, int] = {}


def packable(mv: ModelVersion) -> bool:
    """Whether requests for ``mv`` may come packed: one request per Execute record, no
    scheduler that reads their inputs, nothing but the stub that answers them."""
    return mv.plain and type(mv.scheduler) is DefaultScheduler


def summary_for(loaded: LoadedModels, name: str, version: str, no_cache: bool) -> list[Any] | None:
    """The :func:`snapshot` of the model version a request names; None where it has none (no
    such version, or requests for it are not packed: ``no_cache`` false with a response cache)."""
    try:
        mv = loaded.resolve(name, version)
    except ShoalError:
        return None
    return snapshot(mv.summary) if no_cache and packable(mv) else None


def version_for(loaded: LoadedModels, call: PackedCall) -> ModelVersion | None:
    """The model version ``call`` was packed for, serving; None: the core's own path takes it
    (``call.stale`` set when the version is gone or another one took its place)."""
    try:
        mv = loaded.resolve(call.model_name, call.model_version)
    except ShoalError:
        call.stale = True
        return None
    if mv.summary.generation != call.generation:
        call.stale = True
        return None
    if mv.state is not ModelState.READY or mv.down is not None:
        return None
    return mv


def admit(
    call: PackedCall, loaded: LoadedModels, gate: DrainGate, tracing: TraceSettings
) -> tuple[ModelVersion, RequestRecord] | None:
    """The model version ``call`` is for and the record to schedule it with, counted in by
    ``gate``; None: the core's own path takes it (see :func:`version_for`; or a drain)."""
    mv = version_for(loaded, call)
    if mv is None or gate.closed:
        return None
    gate.enter(call.model_name)
    return mv, record(call, tracing.context_for(mv.name))


def record(call: PackedCall, trace_context: str) -> RequestRecord:
    """The record the core schedules ``call`` with: its scheduling fields, the packed bytes
    (``RequestRecord.packed``) in place of the rest."""
    return RequestRecord(
        call.request_id,
        0,
        0,
        {},
        [],
        [],
        call.timeout_us,
        private_inputs=call.private_inputs,
        trace_context=trace_context,
        packed=call.head,
    )


def snapshot(summary: ModelSummary) -> list[Any]:
    """What a worker checks and stages a request with, as plain values
    (``frontends/workers/packing.py`` reads them): the generation first, which a packed request
    names."""
    inputs = [
        [r.name, r.datatype, list(r.expected), None if r.reshape is None else list(r.reshape)]
        for r in summary.inputs.values()
    ]
    return [
        summary.generation,
        summary.name,
        summary.max_batch_size,
        summary.inline_budget,
        inputs,
        summary.required,
        summary.outputs,
    ]
