"""A unit of work travelling from a scheduler to an instance, and what comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.ipc.arena import Block
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.promise import Promise


class OutputOwner(Protocol):
    """The instance whose stub wrote a completion's outputs (a ``StubInstance``).

    A protocol rather than the class: this module is compiled, and a compiled module that
    names ``StubInstance`` (which imports this module) crashed at import in the cycle.
    """

    def output_view(self, process: Any, block: Block | CudaLocation) -> memoryview: ...

    def release_outputs(self, process: Any, blocks: list[Block]) -> None: ...

    def release_cuda(self, locations: list[CudaLocation]) -> None: ...


@dataclass(eq=False)
class Completion:
    """A response record and the instance whose output arena holds its blocks."""

    response: ResponseRecord
    instance: OutputOwner
    #: The stub that wrote the outputs (a ``StubChannel``).
    process: Any
    #: Blocks this completion must give back: outputs in the stub's arena and inputs passed
    #: through unchanged. Blocks of other arenas (an ensemble's intermediates) belong elsewhere.
    owned: list[Block]
    queue_ns: int = 0
    compute_ns: tuple[int, int, int] = (0, 0, 0)
    #: Called once the completion's blocks are given back (a decoupled stream counts them).
    on_release: Callable[[], None] | None = None
    #: When the supervisor received the stub's Result (monotonic ns).
    received_ns: int = 0
    #: CUDA pool blocks of the outputs: the stub handed them on, the supervisor frees them
    #: (a shared empty tuple when there are none: nothing is made per response).
    owned_cuda: Sequence[CudaLocation] = ()
    #: A decoupled model's response sent with the final flag: the request's last.
    final: bool = False

    def __init__(
        self,
        response: ResponseRecord,
        instance: OutputOwner,
        process: Any,
        owned: list[Block],
        queue_ns: int = 0,
        compute_ns: tuple[int, int, int] = (0, 0, 0),
        on_release: Callable[[], None] | None = None,
        received_ns: int = 0,
        owned_cuda: Sequence[CudaLocation] = (),
        final: bool = False,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.response = response
        self.instance = instance
        self.process = process
        self.owned = owned
        self.queue_ns = queue_ns
        self.compute_ns = compute_ns
        self.on_release = on_release
        self.received_ns = received_ns
        self.owned_cuda = owned_cuda
        self.final = final

    def view(self, block: Block | CudaLocation) -> memoryview:
        """A read-only view of one output block (a host copy of a GPU one)."""
        return self.instance.output_view(self.process, block)

    def release(self) -> None:
        """Give back every block this completion owns. Call once."""
        blocks, self.owned = self.owned, _NO_BLOCKS
        if blocks:  # (small outputs are inline: nothing to give back, no call for it)
            self.instance.release_outputs(self.process, blocks)
        cuda, self.owned_cuda = self.owned_cuda, ()
        if cuda:
            self.instance.release_cuda(list(cuda))
        on_release, self.on_release = self.on_release, None
        if on_release is not None:
            on_release()


#: The blocks of a completion that owns none (or none any more): shared, never added to.
_NO_BLOCKS: list[Block] = []


@dataclass(eq=False)
class Work:
    """One request on its way through a scheduler.

    ``input_blocks`` belong to the supervisor's input arena; whoever finishes the work (the
    instance on a result or a crash, the scheduler when dropping it) returns them.
    """

    record: RequestRecord
    input_blocks: list[Block]
    #: Its outcome: a Future where the requester awaits it, a Promise where it is called back.
    future: asyncio.Future[Completion] | Promise
    #: Inferences in this request: its first dimension for a batching model, else 1.
    batch_size: int = 1
    #: Scheduler-specific data (priority, sequence slot, ...), opaque to instances.
    tag: Any = None
    #: Called by the instance with the completion before the requester sees it (each response
    #: of a decoupled model; e.g. the sequence batcher keeps implicit state from it); may
    #: replace outputs or raise nothing.
    on_complete: Callable[[Completion], None] | None = None
    enqueued_ns: int = 0
    dispatched_ns: int = 0
    #: For a decoupled model: each response as it comes, then ``None`` after the final one
    #: (an error ends the stream too).
    stream: asyncio.Queue[Completion | BaseException | None] | None = None
    #: The requester stopped reading the stream: responses are released as they arrive.
    closed: bool = False
    #: For a decoupled model, whose statistics are recorded once both are known: the compute
    #: times of the execution that ran it (when execute returned), and when its final response
    #: arrived (monotonic ns; 0 before).
    compute_ns: tuple[int, int, int] | None = None
    final_ns: int = 0
    #: Set by the instance that runs the work: tells the model the client went away.
    on_cancel: Callable[[], None] | None = None
    #: For a decoupled model: called once its final response arrived or its stream failed
    #: (the sequence batcher holds a sequence's next request until then).
    on_final: Callable[[], None] | None = None
    #: Set by a scheduler that takes requests back (an iterative sequence): called by the
    #: instance with ``True`` when the model released the request with RESCHEDULE (queue it
    #: again), ``False`` when the request is done for good.
    reschedule: Callable[[Work, bool], None] | None = None
    #: When its ``timeout`` parameter expires while queued (monotonic ns; 0: never). A request
    #: an instance sent ahead is still queued, in the stub's ring, until it starts.
    queue_deadline_ns: int = 0
    #: Set by the sequence batcher's oldest strategy once the work's completion issues its
    #: slot's next request (a rescheduled request comes through again: one hook per request).
    watched: bool = False
    #: For an iterative sequence: the request as it came (its inputs, how many input blocks,
    #: its requested outputs, whether it ends its sequence), restored on each reschedule.
    iteration: tuple[list[Any], int, list[str], bool] | None = None
    #: Answered through a frontend worker's relay (``requests/relayed.py``): the core may
    #: hand the worker the stub's response record undecoded.
    relayed: bool = False
    #: Set while the work is inside a stub: from its batch's dispatch until the stub answered
    #: or failed the batch, died, or stopped (the ledger's ``InFlight``).
    inside: bool = False
    #: Called once it is no longer inside a stub, where its requester ended first (cancelled,
    #: timed out): the request's client regions are let go then (``client_shm.keep_inside``).
    on_leave: Callable[[], None] | None = None

    def __init__(
        self,
        record: RequestRecord,
        input_blocks: list[Block],
        future: asyncio.Future[Completion] | Promise,
        batch_size: int = 1,
        tag: Any = None,
        on_complete: Callable[[Completion], None] | None = None,
        stream: asyncio.Queue[Completion | BaseException | None] | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path. The
        # fields below ``stream`` are set by whoever handles the work, never at its creation.
        self.record = record
        self.input_blocks = input_blocks
        self.future = future
        self.batch_size = batch_size
        self.tag = tag
        self.on_complete = on_complete
        self.enqueued_ns = time.monotonic_ns()
        self.dispatched_ns = 0
        self.stream = stream
        self.closed = False
        self.compute_ns = None
        self.final_ns = 0
        self.on_cancel = None
        self.on_final = None
        self.reschedule = None
        self.queue_deadline_ns = 0
        self.watched = False
        self.iteration = None
        self.relayed = False
        self.inside = False
        self.on_leave = None

    def left(self) -> None:
        """It is no longer inside a stub (answered, failed, its stub gone)."""
        self.inside = False
        on_leave, self.on_leave = self.on_leave, None
        if on_leave is not None:
            on_leave()

    def cancel(self) -> None:
        """The client went away: drop the work if queued, flag it to the model if running."""
        if not self.future.done():
            self.future.cancel()
        on_cancel, self.on_cancel = self.on_cancel, None
        if on_cancel is not None:
            on_cancel()

    def awaited(self) -> asyncio.Future[Completion]:
        """The Future of a work whose requester awaits it (it made the work with one)."""
        future = self.future
        assert isinstance(future, asyncio.Future)
        return future

    @property
    def abandoned(self) -> bool:
        """The client went away before the work was dispatched."""
        future = self.future
        if isinstance(future, Promise):  # compiled: a native call, not a generic one
            return future.done()
        return future.done()

    def answer(self, completion: Completion) -> None:
        """Give the requester its completion (the work must not be abandoned)."""
        future = self.future
        if isinstance(future, Promise):  # compiled: a native call, not a generic one
            future.set_result(completion)
        else:
            future.set_result(completion)
