"""The core's side of the relay: requests a frontend worker checked, staged and packed.

A worker asks once per model version for the snapshot of its summary (:func:`snapshot`), checks
each request against it, stages every input itself (inline bytes, or blocks of its own arena)
and sends the request's wire record already packed, up to ``timeout_us``
(``frontends/workers/relay.py``). The core reads only what it schedules with
(:class:`~shoal.core.relayed.RelayedCall`) and splices the packed bytes into the Execute
(``messages.encode``).
A model the relay does not fit (an ensemble, a decoupled model, a batcher that forms or
routes batches from the requests' inputs, the response cache) has no snapshot, and its
requests take the core's own path; so does a request whose snapshot is stale (the model was
reloaded: its summary's ``generation`` changed), which the worker then sends again that way.
"""

from __future__ import annotations

from typing import Any

from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests.summary import ModelSummary
from shoal.supervisor.schedulers.default import DefaultScheduler


def relayable(mv: ModelVersion) -> bool:
    """Whether requests for ``mv`` may come relayed: one request per Execute record, no
    scheduler that reads their inputs, nothing but the stub that answers them."""
    return mv.plain and type(mv.scheduler) is DefaultScheduler


def snapshot(summary: ModelSummary) -> list[Any]:
    """What a worker checks and stages a request with, as plain values
    (``frontends/workers/relay.py`` reads them): the generation first, which a relayed request
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
