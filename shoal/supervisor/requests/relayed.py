"""Answers relayed from the stub's response record to a frontend worker (issue 25).

A request of :meth:`InferenceService.start_infer` from a frontend worker's link is answered
without an ``InferResponse``: the core records its statistics and hands the worker's link the
completion itself (the stub's response record and the blocks it owns), which the link writes
into the answer frame as it is (docs/decisions.md, "The core relays the stub's answer"). The
requests whose response the core must still make or change keep the old path, chosen once per
request (:func:`relays`): classification outputs and outputs in a client's shared memory.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from shoal.ipc.records import RequestRecord
from shoal.supervisor.requests.responses import model_error
from shoal.supervisor.work import Completion, Work

if TYPE_CHECKING:
    from shoal.supervisor.models.version import ModelVersion


class Relay(Protocol):
    """Where a relayed completion goes (the worker link's reply to one call)."""

    def relay(self, model: str, version: str, completion: Completion) -> None:
        """Answer the call with ``completion``'s outputs and release it once they are sent;
        never raises (a failure is the call's error answer)."""
        ...


def relays(relay: Relay | None, record: RequestRecord, classes: dict[str, int]) -> Relay | None:
    """``relay`` if a staged request's answer may be relayed: nothing of its response is the
    core's to make (classification) or to write (outputs in the client's regions)."""
    if classes or record.output_regions:
        return None
    return relay


def relay_completed(
    mv: ModelVersion, work: Work, completion: Completion, started: int, relay: Relay
) -> None:
    """A relayed request is done: raise the model's error, or count its success and relay."""
    error = completion.response.error
    if error is not None:
        raise model_error(error)
    record_success(mv, work, completion, started)
    relay.relay(mv.name, mv.version_label, completion)


def record_success(mv: ModelVersion, work: Work, completion: Completion, started: int) -> None:
    """The statistics of a request answered with ``completion`` (Triton's figures)."""
    finished = time.monotonic_ns()
    stats = mv.stats
    stats.success(work.batch_size, finished - started, completion.queue_ns, completion.compute_ns)
    if stats.latencies is not None:  # its one response is its first
        stats.first_response(finished - started)
    if stats.overhead is not None:
        stats.answered_stages(
            work.dispatched_ns - work.enqueued_ns,
            completion.compute_ns,
            finished - completion.received_ns,
            finished - started,
        )
