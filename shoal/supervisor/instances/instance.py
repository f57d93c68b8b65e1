"""A model instance: one stub process at a time, restarted with back-off when it dies.

The instance pulls work from its scheduler only while its stub is ready, so queued requests wait
for the other instances or for the restart; requests already inside a dead stub fail with
UNAVAILABLE naming the instance and how it died.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.core.errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    ShoalError,
    Unavailable,
)
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.queue import PeerGone
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.decoupled import OpenStream, response_blocks, response_cuda
from shoal.supervisor.instances.process import StubLaunch, StubProcess, describe_exit
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.schedulers.dynamic import TIMEOUT_EXPIRED
from shoal.supervisor.work import Completion, Work

log = logging.getLogger("shoal")

#: How long model readiness waits for a model's ``is_ready()`` (Triton's 5 s).
USER_READY_TIMEOUT_S = 5.0

_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
_arena_ids = itertools.count(1)
#: Request keys, unique across instances: a rescheduled request keeps its key (and its open
#: response stream) wherever it runs next.
_request_keys = itertools.count(1)
#: How many batches a lone instance behind the default scheduler gets ahead of the one it runs.
#: Under load its ring then rarely runs dry, so the stub seldom sleeps and seldom needs ringing
#: for the next request: identity 64 B at c=8, 3 against 1 ahead: HTTP 7,243-8,191 -> 8,147-9,479
#: infer/s, gRPC 7,596-7,902 -> 7,939-8,579 (docs/perf.md).
SEND_AHEAD = 3


#: Makes the stub of an instance from its launch and output arena id (a kind of StubChannel).
MakeStub = Callable[[StubLaunch, int], StubChannel]


class LoadError(Exception):
    """The stub could not start or the model's ``initialize`` raised; the text says why in one
    line, fit for clients; ``traceback`` is the model's traceback, for the log ("" if none)."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


class BlsHandler(Protocol):
    """Serves the BLS calls a stub makes (the supervisor's BLS router)."""

    def handle(self, caller: StubInstance, proc: StubChannel, call: msg.BlsCall) -> None: ...

    def done(self, proc: StubChannel, call_id: int) -> None: ...

    def cancel(self, proc: StubChannel, call_id: int) -> None: ...

    def forget_process(self, proc: StubChannel) -> None: ...


class ControlHandler(Protocol):
    """Answers a stub's model-control and custom-metric calls."""

    def handle(self, caller: StubInstance, proc: StubChannel, call: msg.ControlCall) -> None: ...

    def forget_process(self, proc: StubChannel) -> None: ...


class ExecutionGrant(Protocol):
    """The rate limiter's grant of one execution; ``release`` (idempotent) frees it."""

    def release(self) -> None: ...


class RateLimitGate(Protocol):
    """This instance's place in the rate limiter (``--rate-limit execution_count``)."""

    async def acquire(self) -> ExecutionGrant: ...


class BatchSource(Protocol):
    """What an instance pulls work from (a scheduler)."""

    async def next_batch(self) -> list[Work]: ...

    def requeue(self, batch: list[Work]) -> None: ...


@dataclass(frozen=True)
class InstanceSpec:
    """Everything needed to (re)start one instance."""

    model_name: str
    instance_name: str
    init_args: dict[str, str]
    model_file: str
    launch: StubLaunch
    output_arena: tuple[int, int, int]
    #: A Python-based backend's ``model.py``, run instead of ``model_file``; "" for none.
    runtime_file: str = ""
    restart_backoff: tuple[float, float] = (0.1, 5.0)
    #: Batches in one stub at once when the model's execute is ``async def``.
    async_concurrency: int = 1
    #: Seconds one execute may take before the stub is killed and restarted (None: no limit).
    execute_timeout: float | None = None
    #: This many deaths within ``crash_window`` seconds: stop restarting (a crash loop).
    crash_limit: int = 5
    crash_window: float = 60.0


class _Slots:
    """How many more batches the work loop may have at the stub (a counting semaphore).

    ``asyncio.Semaphore`` is interpreted Python, several calls for each acquire and release on
    every request; this one is compiled with the module and takes a free slot without a
    coroutine. One waiter at most: the instance's work loop.
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiter: asyncio.Future[None] | None = None

    def take(self) -> bool:
        """Take a slot if one is free."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def take_when_free(self) -> None:
        while not self.take():
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    def release(self) -> None:
        self._free += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@dataclass(eq=False)
class _InFlight:
    """A batch sent to the stub and not yet answered."""

    batch: list[Work]
    #: The slots the work loop took one of for this batch (each stub has its own).
    slots: _Slots
    #: The execute timeout's timer, armed once the batch is executing.
    timer: asyncio.TimerHandle | None = None
    #: For a batch sent ahead: the timer of its requests' queue timeout, until it starts.
    queue_timer: asyncio.TimerHandle | None = None
    #: The rate limiter's grant this batch runs under, released when it is done.
    grant: ExecutionGrant | None = None


class StubInstance:
    """Runs batches on its current stub process and restarts it when it dies.

    A model with one instance behind the default scheduler has its next requests **sent ahead**
    (``SEND_AHEAD``) while the current one executes: they wait in the stub's ring instead of the
    scheduler's queue, so the stub goes from one request to the next without sleeping and
    neither side rings a doorbell for it. The stub still runs one batch at a time (Triton's
    contract for a sync execute); the execute timeout starts when a batch starts executing; the
    queue time runs until the stub starts a batch; a request sent ahead that had not started when
    the stub died goes back to the queue instead of failing.
    """

    def __init__(
        self,
        spec: InstanceSpec,
        directory: SegmentDirectory,
        free_inputs: Callable[[list[Block]], None],
        stats: StatsRecorder,
        make_stub: MakeStub = StubProcess,
    ) -> None:
        self.spec = spec
        #: Starts a stub: a process (StubProcess), or in-process for tests (LoopbackStub).
        self._make_stub = make_stub
        self.stats = stats
        self.name = spec.instance_name
        self.restarts = 0
        self.last_exit = ""
        self._directory = directory
        self._cuda = directory.cuda
        self._free_inputs = free_inputs
        self._loop = asyncio.get_running_loop()
        self._proc: StubChannel | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._batch_ids = itertools.count(1)
        self._streams: dict[int, OpenStream] = {}
        #: Routes BLS calls made by this instance's model (set by the model loader).
        self.bls: BlsHandler | None = None
        self._hung: str | None = None
        self._slots = _Slots(1)
        self._limit = 1
        #: Send the next batch while the current one executes (set by the model loader).
        self.send_ahead = False
        #: Set by the model loader under ``--rate-limit execution_count``: each batch waits
        #: for a grant before it is sent.
        self.rate_limit: RateLimitGate | None = None
        self._source: BatchSource | None = None
        self._deaths: list[float] = []
        #: Why the instance gave up restarting (a crash loop), or None.
        self.failed: str | None = None
        #: Told when the instance gives up (the model loader marks the model unavailable).
        self.on_failed: Callable[[StubInstance], None] | None = None
        #: Why the instance has no live stub after a failed restart (None while it has one, or
        #: while its first restart after a death is under way); it keeps retrying.
        self.down: str | None = None
        #: Told when a restart fails and when one succeeds (the model loader updates the
        #: model's readiness and fails its queued requests while no instance is live).
        self.on_health: Callable[[StubInstance], None] | None = None
        #: A stub is starting: its exit is the launcher's to handle, not a crash to restart.
        self._launching = False
        #: Decoupled models answer as they go: the execute timeout does not apply to them.
        self.decoupled = False
        #: Answers model control and custom-metric calls (set by the model loader).
        self.control: ControlHandler | None = None
        #: Batches in the stub, in the order they were sent.
        self._in_flight: dict[int, _InFlight] = {}
        # (error, traceback) when initialize failed, else None.
        self._init_waiter: asyncio.Future[tuple[str, str] | None] | None = None
        self._finalized: asyncio.Future[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._release_pending: list[Block] = []
        self._release_scheduled = False
        self._background: set[asyncio.Future[None]] = set()
        #: Running model_warmup: its executions are not client traffic, so not counted.
        self._warming = False
        #: The model defines ``is_ready()``; the check in flight, if one is.
        self.user_ready = False
        self._readiness: asyncio.Future[bool] | None = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def busy(self) -> bool:
        """A batch is inside the stub."""
        return not self._idle.is_set()

    async def wait_idle(self) -> None:
        """Return once no batch is inside the stub."""
        await self._idle.wait()

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    # -- start ------------------------------------------------------------------------------

    async def start(
        self,
        source: BatchSource,
        warm_up: Callable[[StubInstance], Awaitable[None]] | None = None,
    ) -> None:
        """Spawn the stub and wait for ``initialize``, run ``warm_up`` on it (model_warmup), then
        pull work from ``source``; raises LoadError with the reason."""
        await self._launch()
        if warm_up is not None:
            self._warming = True
            try:
                await warm_up(self)
            except ShoalError as error:
                raise LoadError(str(error)) from None
            finally:
                self._warming = False
        self._worker = asyncio.create_task(self._work_loop(source), name=f"worker {self.name}")

    async def ask_is_ready(self, timeout: float = USER_READY_TIMEOUT_S) -> bool:
        """What the model's ``is_ready()`` says (False when it raised, answered no bool, or
        did not answer within ``timeout``). A check already running is joined, as in Triton:
        one slow ``is_ready()`` is not asked again by every caller."""
        proc = self._proc
        if proc is None or not self._ready.is_set():
            return False
        if self._readiness is None:
            self._readiness = self._loop.create_future()
            try:
                await proc.send_async(msg.ReadinessCheck())
            except PeerGone:
                self._answer_readiness(False, "the stub exited")
        try:
            return await asyncio.wait_for(asyncio.shield(self._readiness), timeout)
        except asyncio.TimeoutError:
            return False

    def _answer_readiness(self, ready: bool, error: str | None) -> None:
        waiting, self._readiness = self._readiness, None
        if error is not None:
            log.info("[%s] is_ready() says not ready: %s", self.name, error)
        if waiting is not None and not waiting.done():
            waiting.set_result(ready and error is None)

    async def run_now(self, batch: list[Work]) -> list[Completion]:
        """Run ``batch`` on this instance at once, outside any scheduler (warmup), and return its
        completions (every response, for a decoupled model). The instance owns the inputs from
        here, as for any batch; the caller releases the completions. Raises the batch's error
        (the stub died, a decoupled model's error response)."""
        proc = self._proc
        if proc is None or not self._ready.is_set():
            raise Unavailable(f"instance '{self.name}' is not ready")
        if self.decoupled:
            for work in batch:
                work.stream = asyncio.Queue()
        await self._slots.take_when_free()
        await self._send_batch(proc, batch, self._slots)
        completions: list[Completion] = []
        failure: BaseException | None = None
        for work in batch:
            if work.stream is None:
                try:
                    completions.append(await work.future)
                except ShoalError as error:
                    failure = failure or error
                continue
            while (item := await work.stream.get()) is not None:
                if isinstance(item, BaseException):
                    failure = failure or item
                else:
                    completions.append(item)
        if failure is not None:
            for completion in completions:
                completion.release()
            raise failure
        return completions

    async def _launch(self) -> None:
        """Start a stub and wait for its ``initialize``. Whatever fails (no file descriptor or
        memory left, the interpreter missing, ``initialize`` raising) leaves nothing behind."""
        self._launching = True
        failure: BaseException | None = None
        try:
            proc = self._make_stub(self.spec.launch, next(_arena_ids))
            self._proc = proc
            try:
                await self._initialize(proc)
            except BaseException as error:  # no await in here: compiled, it loses the error
                failure = error
            if failure is not None:
                await self._discard(proc)
                raise failure
        finally:
            self._launching = False
        self._ready.set()

    async def _initialize(self, proc: StubChannel) -> None:
        for segment in self._directory.input_arena.segments:
            proc.announce(segment)
        self._directory.register(proc)
        self._init_waiter = self._loop.create_future()
        proc.spawn(self._loop, lambda code: self._on_exit(proc, code))
        proc.watch_up(self._loop, lambda: self._drain(proc))
        init = msg.Initialize(
            dict(self.spec.init_args),
            self.spec.model_file,
            proc.output_arena_id,
            self.spec.output_arena,
            self.spec.runtime_file,
        )
        try:
            await proc.send_async(init)
        except PeerGone:
            pass  # it died at once: _on_exit says how, through the waiter
        failure = await self._init_waiter
        if failure is not None:
            raise LoadError(*failure)

    def announce_segment(self, segment: Any) -> None:
        """A new input-arena segment exists: the live stub must be able to map it."""
        if self._proc is not None and self._proc.returncode is None:
            try:
                self._proc.announce(segment)
            except OSError:
                pass  # the stub is dying; its exit is handled on its pidfd

    # -- messages from the stub -------------------------------------------------------------

    def _drain(self, proc: StubChannel) -> None:
        while (payload := proc.recv_up_nowait()) is not None:
            self._dispatch(proc, msg.decode(payload))

    def _dispatch(self, proc: StubChannel, message: msg.Message) -> None:
        match message:
            case msg.Result():
                self._complete(proc, message)
            case msg.Response():
                self._on_response(proc, message)
            case msg.BlsCall():
                if self.bls is not None:
                    self.bls.handle(self, proc, message)
            case msg.BlsDone(call_id=call_id):
                if self.bls is not None:
                    self.bls.done(proc, call_id)
            case msg.BlsCancel(call_id=call_id):
                if self.bls is not None:
                    self.bls.cancel(proc, call_id)
            case msg.ControlCall():
                if self.control is not None:
                    self.control.handle(self, proc, message)
            case msg.SegmentRetired(segment=index):
                self._directory.output_retired(proc, index)
            case msg.Log(level=level, message=text, filename=filename, line=line):
                where = f" ({filename}:{line})" if filename else ""
                log.log(_LOG_LEVELS.get(level, logging.INFO), "[%s]%s %s", self.name, where, text)
            case msg.Readiness(ready=ready, error=error):
                self._answer_readiness(ready, error)
            case msg.Ready(
                error=error, concurrent=concurrent, user_ready=user_ready, traceback=trace
            ):
                self.user_ready = user_ready
                self._limit = max(1, self.spec.async_concurrency) if concurrent else 1
                ahead = SEND_AHEAD if self.send_ahead and self._limit == 1 else 0
                self._slots = _Slots(self._limit + ahead)
                if self._init_waiter is not None and not self._init_waiter.done():
                    self._init_waiter.set_result(None if error is None else (error, trace))
            case msg.Finalized(error=error):
                if error:
                    log.warning("[%s] finalize raised:\n%s", self.name, error)
                if self._finalized is not None and not self._finalized.done():
                    self._finalized.set_result(None)
            case _:
                log.error("[%s] unexpected message %s", self.name, type(message).__name__)

    def _stream_done(self, work: Work) -> None:
        """A decoupled request's statistics, as Triton's: from enqueued to its final response,
        with the compute times of the execution that ran it."""
        compute = work.compute_ns if work.compute_ns is not None else (0, 0, 0)
        queue_ns = work.dispatched_ns - work.enqueued_ns
        self.stats.success(work.batch_size, work.final_ns - work.enqueued_ns, queue_ns, compute)

    def _complete(self, proc: StubChannel, result: msg.Result) -> None:
        entry = self._batch_done(result.batch_id)
        batch = entry.batch if entry is not None else []
        received_ns = time.monotonic_ns()
        if batch and result.executed and not self._warming:
            self.stats.execution(sum(w.batch_size for w in batch), result.compute_ns)
            if self.stats.overhead is not None and result.stub_ns[0]:
                for work in batch:
                    self.stats.stage("ipc_in", result.stub_ns[0] - work.dispatched_ns)
                    self.stats.stage("ipc_out", received_ns - result.stub_ns[1])
        again = {id(batch[i]) for i in result.rescheduled if i < len(batch)}
        for work in batch:
            if id(work) in again:
                self._reschedule(work)
            elif work.stream is not None and not self._warming:
                work.compute_ns = result.compute_ns if result.executed else (0, 0, 0)
                if work.final_ns:  # the final response came before execute returned
                    self._stream_done(work)
        answered = [w for w in batch if w.stream is None]  # decoupled requests answer apart
        for work, response in zip(answered, result.responses, strict=True):
            if id(work) in again:
                continue
            if work.reschedule is not None:
                work.reschedule(work, False)
            outputs = response_blocks(response)
            # An input returned unchanged as an output: its block now belongs to the response.
            passed = [b for b in work.input_blocks if b in outputs]
            self._free_inputs([b for b in work.input_blocks if b not in passed])
            owned = [b for b in outputs if b.arena_id == proc.output_arena_id] + passed
            cuda = self._adopt_cuda(proc, response) if self._cuda.lent_count else _NO_CUDA
            if work.future.done():  # the client went away: nobody will release the outputs
                self.release_outputs(proc, owned)
                if cuda:
                    self.release_cuda(cuda)
            else:
                # Queued until the stub started the batch: a request sent ahead waited in the
                # stub's ring, which is queueing too (the stub stamps the same monotonic clock).
                queue_ns = max(work.dispatched_ns, result.stub_ns[0]) - work.enqueued_ns
                completion = Completion(
                    response, self, proc, owned, queue_ns, result.compute_ns, None, received_ns
                )
                if cuda:
                    completion.owned_cuda = cuda
                if work.on_complete is not None:
                    work.on_complete(completion)
                work.future.set_result(completion)

    def _reschedule(self, work: Work) -> None:
        """The model released ``work`` with RESCHEDULE: it goes back to its scheduler, inputs and
        open response stream kept; a scheduler that cannot take it back fails it, as Triton."""
        if work.reschedule is not None and not work.abandoned:
            work.reschedule(work, True)
            return
        error: ShoalError = InvalidArgument(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model "
            f"of instance '{self.name}' does not support rescheduling: it needs "
            "sequence_batching { iterative_sequence: true }"
        )
        if work.abandoned:
            error = Cancelled(f"a request of instance '{self.name}' was cancelled")
        stream = self._streams.pop(work.record.key, None)
        if stream is not None:
            stream.fail(error)
            return
        self._free_inputs(work.input_blocks)
        if not work.future.done():
            work.future.set_exception(error)

    # -- the work loop ----------------------------------------------------------------------

    async def _work_loop(self, source: BatchSource) -> None:
        self._source = source
        while not self._stopping:
            if not self._ready.is_set():
                await self._ready.wait()
            # One batch at a time (Triton's contract for a sync execute; SEND_AHEAD more sent
            # ahead where allowed), or several for an async execute. A slot is given back when its
            # batch is answered or failed (_batch_done).
            slots = self._slots
            if not slots.take():
                await slots.take_when_free()
            try:
                batch = await source.next_batch()
            except BaseException:
                slots.release()
                raise
            grant = None
            if self.rate_limit is not None:
                try:
                    grant = await self.rate_limit.acquire()
                except BaseException:
                    slots.release()
                    source.requeue(batch)
                    raise
            proc = self._proc
            if self._stopping or proc is None or not self._ready.is_set():
                slots.release()
                if grant is not None:
                    grant.release()
                source.requeue(batch)
                continue
            await self._send_batch(proc, batch, slots, grant)

    async def _send_batch(
        self,
        proc: StubChannel,
        batch: list[Work],
        slots: _Slots,
        grant: ExecutionGrant | None = None,
    ) -> None:
        batch_id = next(self._batch_ids)
        entry = _InFlight(batch, slots, grant=grant)
        self._in_flight[batch_id] = entry
        now = time.monotonic_ns()
        for work in batch:
            work.dispatched_ns = now
            if not work.record.key:
                work.record.key = next(_request_keys)
            work.on_cancel = functools.partial(self._cancel_keys, proc, [work.record.key])
            if work.stream is not None and work.record.key not in self._streams:
                self._streams[work.record.key] = OpenStream(work, self._free_inputs)
        self._idle.clear()
        try:
            proc.forward([t.location for w in batch for t in w.record.inputs], self._directory)
            await proc.send_async(msg.Execute(batch_id, [w.record for w in batch]))
        except PeerGone:
            return  # _on_exit fails the batch
        except ShoalError as error:  # a tensor's arena is gone (its stub died)
            self._fail_unsent(batch_id, error)
            return
        except Exception as error:  # a bug must fail the batch, not stop this worker
            log.exception("[%s] could not send a batch", self.name)
            self._fail_unsent(batch_id, InternalError(f"instance '{self.name}': {error!r}"))
            return
        # A sync execute starts on this batch once the ones sent before it are answered.
        if self._limit > 1 or next(iter(self._in_flight), None) == batch_id:
            self._start_clock(proc, batch_id, entry)
        elif batch_id in self._in_flight:
            self._watch_queue_timeout(proc, entry)

    def _watch_queue_timeout(self, proc: StubChannel, entry: _InFlight) -> None:
        """A request sent ahead is still queued: its ``timeout`` expires at its deadline, as
        it would in the scheduler's queue, and the stub is told not to run it."""
        deadlines = [w.queue_deadline_ns for w in entry.batch if w.queue_deadline_ns]
        if not deadlines:
            return
        delay = max(0, min(deadlines) - time.monotonic_ns()) / 1e9
        entry.queue_timer = self._loop.call_later(delay, self._queue_timeout, proc, entry)

    def _queue_timeout(self, proc: StubChannel, entry: _InFlight) -> None:
        entry.queue_timer = None
        now = time.monotonic_ns()
        expired = [w for w in entry.batch if w.queue_deadline_ns and w.queue_deadline_ns < now]
        for work in expired:
            if not work.future.done():
                work.future.set_exception(Unavailable(TIMEOUT_EXPIRED))
            work.on_cancel = None
        if expired:
            self._cancel_keys(proc, [w.record.key for w in expired])
        if len(expired) < len(entry.batch):
            self._watch_queue_timeout(proc, entry)

    def _start_clock(self, proc: StubChannel, batch_id: int, entry: _InFlight) -> None:
        """Arm the execute timeout of a batch that is executing now."""
        timeout = self.spec.execute_timeout
        if timeout is None or self.decoupled or entry.timer is not None:
            return
        entry.timer = self._loop.call_later(timeout, self._execute_timed_out, proc, batch_id)

    def _execute_timed_out(self, proc: StubChannel, batch_id: int) -> None:
        if batch_id not in self._in_flight or proc.returncode is not None:
            return
        timeout = self.spec.execute_timeout
        log.error(
            "instance '%s': execute took longer than %.3gs: killing its stub", self.name, timeout
        )
        self._hung = f"execute did not finish within {timeout:g}s (execute_timeout_seconds)"
        proc.kill()  # _on_exit fails the batch with DeadlineExceeded

    def _batch_done(self, batch_id: int) -> _InFlight | None:
        """Forget an answered or failed batch and give its slot back."""
        entry = self._in_flight.pop(batch_id, None)
        if entry is None:
            return None
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.queue_timer is not None:
            entry.queue_timer.cancel()
        entry.slots.release()
        if entry.grant is not None:
            entry.grant.release()
        if not self._in_flight:
            self._idle.set()
        elif self._limit == 1 and self._proc is not None:  # the batch sent ahead starts now
            head_id, head = next(iter(self._in_flight.items()))
            if head.queue_timer is not None:
                head.queue_timer.cancel()
                head.queue_timer = None
            self._start_clock(self._proc, head_id, head)
        return entry

    def _on_response(self, proc: StubChannel, message: msg.Response) -> None:
        """One response of a decoupled model's request."""
        stream = self._streams.get(message.key)
        body = message.response
        if stream is None:  # the request was failed already (e.g. shutdown): drop the response
            if body is not None:
                self.release_outputs(
                    proc, [b for b in response_blocks(body) if b.arena_id == proc.output_arena_id]
                )
                if self._cuda.lent_count:
                    self.release_cuda(self._adopt_cuda(proc, body))
            return
        if not self._warming:
            self._response_stats(stream, body)
        if message.final:
            del self._streams[message.key]
            work = stream.work
            if work.reschedule is not None:
                work.reschedule(work, False)
            if not self._warming:
                work.final_ns = time.monotonic_ns()
                if work.compute_ns is not None:  # else when execute returns (_complete)
                    self._stream_done(work)
        completion = None
        if body is not None:
            # An error response is one response among the others (Triton's too): the request
            # goes on until the model sends the final flag.
            owned = [b for b in response_blocks(body) if b.arena_id == proc.output_arena_id]
            completion = Completion(body, self, proc, owned)
            if self._cuda.lent_count:
                completion.owned_cuda = self._adopt_cuda(proc, body)
            if body.error is None and stream.work.on_complete is not None:
                stream.work.on_complete(completion)
        stream.push(completion, message.final)

    def _response_stats(self, stream: OpenStream, body: msg.ResponseRecord | None) -> None:
        now = time.monotonic_ns()
        start = stream.work.dispatched_ns
        previous = stream.last_ns or start
        if body is None:
            outcome = "empty"
        elif body.error is not None:
            outcome = "fail"
        else:
            outcome = "success"
        self.stats.response(stream.responses, outcome, now - previous, now - start)
        stream.responses += 1
        stream.last_ns = now

    def _cancel_keys(self, proc: StubChannel, keys: list[int]) -> None:
        if proc.returncode is None and not proc.send(msg.Cancel(keys)):
            task = asyncio.ensure_future(self._send_quietly(proc, msg.Cancel(keys)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _fail_unsent(self, batch_id: int, error: ShoalError) -> None:
        entry = self._batch_done(batch_id)
        for work in entry.batch if entry is not None else []:
            self._free_inputs(work.input_blocks)
            if not work.future.done():
                work.future.set_exception(error)

    # -- outputs ----------------------------------------------------------------------------

    def output_view(self, proc: StubChannel, block: Block | CudaLocation) -> memoryview:
        if type(block) is Block and block.arena_id == proc.output_arena_id:
            return proc.output_view(block)
        return self._directory.view(block)

    def _adopt_cuda(self, proc: StubChannel, response: msg.ResponseRecord) -> list[CudaLocation]:
        """The CUDA pool blocks lent to ``proc`` that ``response`` hands on (callers on the
        hot path look at ``lent_count`` first: no GPU tensor in flight, nothing to look for)."""
        cuda = response_cuda(response)
        return self._cuda.adopt(proc.pid, cuda) if cuda else []

    def release_cuda(self, locations: list[CudaLocation]) -> None:
        if locations:
            self._cuda.free(locations)

    def release_outputs(self, proc: StubChannel, blocks: list[Block]) -> None:
        """The frontend is done with these blocks (owned by a completion): return them."""
        for block in blocks:
            if block.arena_id != proc.output_arena_id:
                self._free_inputs([block])  # a passed-through input-arena block
            elif proc is self._proc and proc.returncode is None:
                self._release_pending.append(block)
        if self._release_pending and not self._release_scheduled:
            self._release_scheduled = True
            self._loop.call_soon(self._flush_releases)

    def _flush_releases(self) -> None:
        self._release_scheduled = False
        blocks, self._release_pending = self._release_pending, []
        proc = self._proc
        if not blocks or proc is None or proc.returncode is not None:
            return
        if not proc.send(msg.Release(blocks)):
            task = asyncio.ensure_future(self._send_quietly(proc, msg.Release(blocks)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_quietly(self, proc: StubChannel, message: msg.Message) -> None:
        try:
            await proc.send_async(message)
        except PeerGone:
            pass

    # -- death and restart ------------------------------------------------------------------

    def _on_exit(self, proc: StubChannel, returncode: int) -> None:
        how = describe_exit(returncode)
        self._ready.clear()
        if proc is self._proc:
            self._answer_readiness(False, None)
        waiter = self._init_waiter
        if waiter is not None and not waiter.done():
            try:
                self._drain(proc)  # the Ready with the model's error may still be in the ring
            except Exception:  # a record cut short by the death: the exit says enough
                pass
            if not waiter.done():
                died = f"Stub process '{self.name}' is not healthy. It exited during initialize"
                waiter.set_result((f"{died} with {how}", ""))
        if self._finalized is not None and not self._finalized.done():
            self._finalized.set_result(None)
        self._directory.unregister(proc)
        if self._stopping or self._launching or proc is not self._proc:
            # An unloaded or replaced stub, or one that died starting (its launcher reports
            # that): what it held comes back too.
            self._forget(proc)
            return
        self.last_exit = how
        # Triton's words first: log scrapers and its QA look for them.
        log.error(
            "Stub process '%s' is not healthy. Process %d died with %s", self.name, proc.pid, how
        )
        hung, self._hung = self._hung, None
        error: ShoalError = Unavailable(
            f"Stub process '{self.name}' is not healthy. It died with {how}"
        )
        if hung is not None:
            error = DeadlineExceeded(
                f"instance '{self.name}': {hung}; its stub was killed and restarts"
            )
        entries = list(self._in_flight.values())
        self._in_flight.clear()
        self._idle.set()
        for entry in entries:
            for timer in (entry.timer, entry.queue_timer):
                if timer is not None:
                    timer.cancel()
            entry.slots.release()
            if entry.grant is not None:
                entry.grant.release()
        if self._limit == 1 and self._source is not None:
            # A sync stub runs its batches in order: only the first had started. The others
            # were sent ahead and go back to the queue, to the restarted stub or another one.
            for entry in reversed(entries[1:]):
                for work in entry.batch:
                    self._streams.pop(work.record.key, None)
                    work.on_cancel = None
                self._source.requeue(entry.batch)
            entries = entries[:1]
        for entry in entries:
            for work in entry.batch:
                self._free_inputs(work.input_blocks)
                if not work.future.done():
                    work.future.set_exception(error)
        for stream in self._streams.values():
            stream.fail(error)
        self._streams.clear()
        self._forget(proc)
        self._release_pending.clear()
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self.spec.crash_window] + [now]
        if len(self._deaths) >= self.spec.crash_limit:
            self.failed = (
                f"instance '{self.name}' died {len(self._deaths)} times within "
                f"{self.spec.crash_window:g}s (last: {how}); it is not restarted"
            )
            log.error("%s", self.failed)
            if self.on_failed is not None:
                self.on_failed(self)
            self._restart_task = asyncio.create_task(self._discard(proc))
            return
        self._restart_task = asyncio.create_task(self._restart(proc))

    async def _restart(self, dead: StubChannel) -> None:
        """Start a new stub until one comes up, waiting longer after each failure. Every kind
        of failure is retried: one that passes (file descriptors or memory exhausted for a
        moment) must not leave the model without an instance for good."""
        await self._discard(dead)
        first, cap = self.spec.restart_backoff
        delay = first
        attempt = 0
        while not self._stopping:
            await asyncio.sleep(delay)
            self.restarts += 1
            attempt += 1
            try:
                await self._launch()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                reason = str(error) if isinstance(error, LoadError) else repr(error)
                delay = min(delay * 2, cap)
                self.down = (
                    f"instance '{self.name}' has no live stub: restart {attempt} failed: "
                    f"{reason}; retrying in {delay:g}s"
                )
                log.error("%s", self.down)
                if self.on_health is not None:
                    self.on_health(self)
                continue
            if self.down is not None:
                self.down = None
                if self.on_health is not None:
                    self.on_health(self)
            log.info("instance '%s' restarted (restart %d)", self.name, self.restarts)
            return

    def _forget(self, proc: StubChannel) -> None:
        """Give back what a stub that exited held: the BLS responses it kept, its open calls,
        its custom metrics, the CUDA pool blocks lent to it."""
        if self.bls is not None:
            self.bls.forget_process(proc)
        if self.control is not None:
            self.control.forget_process(proc)
        self._cuda.forget_process(proc.pid)

    async def _discard(self, proc: StubChannel) -> None:
        """Wait for (or force) the exit of a stub we are done with, then close its resources."""
        await self._wait_exit(proc)
        self._directory.unregister(proc)
        proc.close(self._loop)
        if self._proc is proc:
            self._proc = None

    # -- stop -------------------------------------------------------------------------------

    async def stop(self, timeout: float) -> None:
        """finalize() and the stub's exit within ``timeout``, else SIGKILL; releases everything.

        ``timeout`` bounds the whole stop (the server's exit timeout is one deadline, as in
        Triton): a stub whose finalize does not return in time (its execute hangs, say) is
        killed at once, not given further graces."""
        self._stopping = True
        self._ready.clear()
        if self._worker is not None:
            self._worker.cancel()
        if self._restart_task is not None:
            self._restart_task.cancel()
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            deadline = self._loop.time() + timeout
            self._finalized = self._loop.create_future()
            finalized = False
            try:
                await asyncio.wait_for(self._stop_process(proc), timeout)
                finalized = True
            except (asyncio.TimeoutError, PeerGone):
                log.warning(
                    "instance '%s' did not finalize in %.1fs: killing it", self.name, timeout
                )
                proc.kill()
            if finalized:  # it exits by itself, in what is left of the timeout (a moment at least)
                exit_within = max(_EXIT_GRACE, deadline - self._loop.time())
                try:
                    await asyncio.wait_for(asyncio.shield(proc.exited), exit_within)
                except asyncio.TimeoutError:
                    log.warning("instance '%s' did not exit after finalize: killing it", self.name)
                    proc.kill()
        await self._discard(proc)
        for entry in self._in_flight.values():  # their executions are over: free the resources
            if entry.grant is not None:
                entry.grant.release()

    async def _stop_process(self, proc: StubChannel) -> None:
        await proc.send_async(msg.Finalize())
        assert self._finalized is not None
        await self._finalized

    async def _wait_exit(self, proc: StubChannel) -> None:
        if not proc.spawned:
            return
        for action, grace in ((None, 2.0), (proc.terminate, 2.0), (proc.kill, 5.0)):
            if proc.exited.done():
                return
            if action is not None:
                action()
            try:
                await asyncio.wait_for(asyncio.shield(proc.exited), grace)
            except asyncio.TimeoutError:
                continue


#: Seconds a stub gets to exit after its finalize returned, even at the stop's deadline.
_EXIT_GRACE = 0.5

#: What a response without GPU tensors owns of the CUDA pools.
_NO_CUDA: list[CudaLocation] = []
