"""The core's side of the relay: requests a frontend worker checked, staged and packed.

A worker asks once per model version for the snapshot of its summary (:func:`snapshot`), checks
each request against it, stages every input itself (inline bytes, or blocks of its own arena)
and sends the request's wire record already packed, up to ``timeout_us``
(``frontends/workers/packing.py``). The core reads only what it schedules with
(:class:`~shoal.core.packed.PackedCall`) and splices the packed bytes into the Execute
(``messages.encode``).
A model the relay does not fit (an ensemble, a decoupled model, the sequence batcher, which
forms or routes batches from the requests' inputs, the response cache) has no snapshot, and its
requests take the core's own path (:func:`packable`; the dynamic batcher's requests come
packed, with what it reads of them, but never go straight to a stub: :func:`direct_eligible`);
so does a request whose snapshot is stale (the model was reloaded: its summary's
``generation`` changed), which the worker then sends again that way.
"""

from __future__ import annotations

from typing import Any

from shoal.core.errors import ShoalError
from shoal.core.packed import PackedCall
from shoal.core.types import InferInput, InferRequest, ParamValue, RequestedOutput
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import CudaRegionLocation, RegionLocation, TensorDesc
from shoal.supervisor.drain import DrainGate
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.requests.summary import ModelSummary
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.schedulers.dynamic import DynamicBatcher

#: The classes a packed request asks for: none (a worker packs no request that asks).
NO_CLASSES: dict[str, int] = {}

# The empty containers of every packed request's record and request, shared: seven fewer
# objects made and freed per request. Nothing fills them: a packed record's fields travel
# packed (``messages.encode`` splices ``packed``), only the default scheduler and the dynamic
# batcher take it (the schedulers that rewrite a record's inputs never do; the batcher reads
# ``parameters`` for a priority, which a packed request never carries where it counts, and its
# shape key comes with the call), and its request has no inputs, outputs or parameters to add
# to. A test checks they stay empty after requests.
_EMPTY_PARAMETERS: dict[str, Any] = {}
_EMPTY_NAMES: list[str] = []
_EMPTY_INPUTS: list[TensorDesc] = []
_EMPTY_REGIONS: dict[str, RegionLocation | CudaRegionLocation] = {}
_EMPTY_TENSORS: list[InferInput] = []
_EMPTY_OUTPUTS: list[RequestedOutput] = []
_NO_PARAMS: dict[str, ParamValue] = {}

#: The most ``(model, version)`` pairs numbered for packed calls (:class:`PackingSlots`): the
#: versions a client may name are many ("1", "01", ...); past it, requests take the core's way.
MAX_SLOTS = 4096


class PackingSlots:
    """The ``(model, version)`` pairs, as requests name them, that workers hold snapshots for,
    numbered: a packed call names its pair by number (``core/packed.py``), which the core reads
    with a list index where it decoded two strings. The pair is resolved on every call still
    (a version named "" follows the policy's latest), and the snapshot's generation checked."""

    def __init__(self, loaded: LoadedModels) -> None:
        self.loaded = loaded
        self.pairs: list[tuple[str, str]] = []
        self._numbers: dict[tuple[str, str], int] = {}

    def number(self, name: str, version: str) -> int | None:
        """The slot of ``(name, version)``, numbered now if new; None once all are taken."""
        pair = (name, version)
        number = self._numbers.get(pair)
        if number is None and len(self.pairs) < MAX_SLOTS:
            number = self._numbers[pair] = len(self.pairs)
            self.pairs.append(pair)
        return number


def direct_eligible(mv: ModelVersion) -> bool:
    """Whether requests for ``mv`` may go straight from a worker to a stub (``direct_routes``):
    one request per Execute, no scheduler in the core to see them, nothing but the stub that
    answers them."""
    return mv.plain and type(mv.scheduler) is DefaultScheduler


def packable(mv: ModelVersion) -> bool:
    """Whether requests for ``mv`` may come packed: one request per Execute record, or the
    dynamic batcher's, which reads nothing of a request but its batch size, timeout, shape key
    (which comes with the packed call) and priority (:func:`batching`). The sequence batcher,
    which also makes DynamicBatchers (one per instance, for ``oldest``), is neither: ``type``
    is checked, not ``isinstance``."""
    return mv.plain and type(mv.scheduler) in (DefaultScheduler, DynamicBatcher)


def batching(mv: ModelVersion) -> list[Any]:
    """What a worker needs of ``mv``'s dynamic batcher, as plain values: the parameters that
    send a request the core's way (``priority`` where there are priority levels: the batcher
    reads it from a record's parameters, which a packed record does not have), the inputs whose
    shapes go into the shape key and whether every given input does (optional inputs:
    ``_batching.shape_key``)."""
    scheduler = mv.scheduler
    if type(scheduler) is not DynamicBatcher:
        return [[], [], False]
    settings = scheduler.settings
    core = ["priority"] if settings.priority_levels else []
    return [core, sorted(settings.equal_shape_inputs), settings.has_optional_input]


def summary_for(slots: PackingSlots, name: str, version: str, no_cache: bool) -> list[Any] | None:
    """The :func:`snapshot` of the model version a request names; None where it has none (no
    such version, or requests for it are not packed: ``no_cache`` false with a response cache;
    or no slot is left)."""
    try:
        mv = slots.loaded.resolve(name, version)
    except ShoalError:
        return None
    if not (no_cache and packable(mv)):
        return None
    slot = slots.number(name, version)
    return None if slot is None else snapshot(mv.summary, slot, batching(mv))


def version_for(slots: PackingSlots, call: PackedCall) -> tuple[str, ModelVersion] | None:
    """The model version ``call`` was packed for, serving, and the model's name; None: the
    core's own path takes it (``call.stale`` set when the version is gone or another one took
    its place)."""
    pairs = slots.pairs
    if call.slot >= len(pairs):  # never one of ours: a worker's bug, answered the core's way
        call.stale = True
        return None
    name, version = pairs[call.slot]
    try:
        mv = slots.loaded.resolve(name, version)
    except ShoalError:
        call.stale = True
        return None
    if mv.summary.generation != call.generation:
        call.stale = True
        return None
    if mv.state is not ModelState.READY or mv.down is not None:
        return None
    call.request = request(name, version, call)
    return name, mv


def admit(
    call: PackedCall, slots: PackingSlots, gate: DrainGate, tracing: TraceSettings
) -> tuple[ModelVersion, RequestRecord, InferRequest] | None:
    """The model version ``call`` is for, the record to schedule it with and the request its
    answer names, counted in by ``gate``; None: the core's own path takes it (see
    :func:`version_for`; or a drain)."""
    found = version_for(slots, call)
    if found is None or gate.closed:
        return None
    name, mv = found
    request = call.request
    assert request is not None  # made once its version is found
    gate.enter(name)
    context = tracing.context_for(mv.name)
    if context and call.traced:  # sampled, and its worker's frontend sends its timestamps
        request.trace_id = tracing.hold(context)
    return mv, record(call, context), request


def record(call: PackedCall, trace_context: str) -> RequestRecord:
    """The record the core schedules ``call`` with: its scheduling fields, the packed bytes
    (``RequestRecord.packed``) in place of the rest (its containers the shared empty ones)."""
    return RequestRecord(
        call.request_id,
        0,
        0,
        _EMPTY_PARAMETERS,
        _EMPTY_NAMES,
        _EMPTY_INPUTS,
        call.timeout_us,
        0,
        _EMPTY_REGIONS,
        call.private_inputs,
        trace_context,
        call.head,
    )


def request(name: str, version: str, call: PackedCall) -> InferRequest:
    """What the answer to ``call`` names (its containers the shared empty ones)."""
    return InferRequest(name, version, call.request_id, _EMPTY_TENSORS, _EMPTY_OUTPUTS, _NO_PARAMS)


def snapshot(summary: ModelSummary, slot: int, batched: list[Any] | None = None) -> list[Any]:
    """What a worker checks and stages a request with, as plain values
    (``frontends/workers/snapshots.py`` reads them): the generation first and the slot last,
    which a packed request names; before the slot, what the dynamic batcher reads
    (:func:`batching`)."""
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
        *([[], [], False] if batched is None else batched),
        slot,
    ]
