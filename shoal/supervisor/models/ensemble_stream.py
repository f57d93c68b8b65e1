"""A decoupled ensemble's request: its responses stream, as Triton's do.

An ensemble is decoupled when one of its steps is (``_ensemble_checks.decoupled_flow``). Each
response of a decoupled step runs the steps that read its outputs once more, in a *frame* of
their own: the tensors of that response and of the steps it runs. A plain step's outputs stay
in its frame. Each frame in which every requested output gets made is one response of the
ensemble; the last one (or the final flag alone) comes once no step runs anywhere. The load
checks ensure that a step reads the tensors of one frame only.

Blocks: a frame holds the completions of its steps (and the decoupled response that opened it)
until no step runs in it, its response (if any) is released, and its own frames are gone (a
decoupled model may return an input, so a frame may read its parent's blocks). The first
error, or the client going away, cancels every step still running (a decoupled step's request
is told, as its client's cancel would) and ends the stream.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from shoal.core.backlog import BACKLOG_MAX
from shoal.core.errors import (
    InvalidArgument,
    ModelError,
    ResourceExhausted,
)
from shoal.ipc.arena import Block
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.extensions.trace_files import Trace
from shoal.supervisor.models._ensemble_outcomes import (
    StepTimes,
    count_failure,
    count_success,
    in_ensemble,
    step_error,
    step_inputs,
    step_record,
)
from shoal.supervisor.models._ensemble_plan import StepPlan, needed_steps
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests import traced
from shoal.supervisor.requests.staging import batch_of, inline_bytes, spill_inline
from shoal.supervisor.work import Completion, Work

_Tensors = dict[str, TensorDesc]
#: A response's tensors (the ensemble's requested outputs), and what releases them.
Emit = Callable[[_Tensors, Callable[[], None]], None]
#: Called once when the request ends: None, or the error that ended it.
End = Callable[[BaseException | None], None]
#: What a decoupled step's stream carries (``Work.stream``).
_Item = Completion | BaseException | None


class _Relay(asyncio.Queue[_Item]):
    """A decoupled step's stream that hands each item to the run on the next loop turn (in
    order) instead of keeping it for a reader: no task per step, and never a backlog."""

    def __init__(self, handle: Callable[[_Item], None]) -> None:
        super().__init__()
        self._handle = handle
        self._loop = asyncio.get_running_loop()

    def put_nowait(self, item: _Item) -> None:
        self._loop.call_soon(self._handle, item)


class StreamRun:
    """One request of a decoupled ensemble, or of an ensemble that is a step of one."""

    def __init__(
        self,
        runner: EnsembleRunner,
        mv: ModelVersion,
        base: RequestRecord,
        wanted: tuple[str, ...],
        chain: tuple[str, ...],
        emit: Emit,
        end: End,
    ) -> None:
        self.runner = runner
        self.mv = mv
        self.base = base
        self.plan = runner.plan(mv)
        #: The tensors each response is made of.
        self.wanted = wanted
        self.chain = (*chain, mv.name)
        self._emit = emit
        self._end = end
        self.finished = False
        self.emitted = 0
        self.times = StepTimes()
        self.frames: set[_Frame] = set()  # those in which steps may still run
        self._works: set[Work] = set()
        self._nested: set[StreamRun] = set()
        #: Its trace, if sampled: its steps' are children, ended with it.
        self.trace: Trace | None = None

    def start(self, inputs: _Tensors, on_free: Callable[[], None] | None = None) -> None:
        if not self.finished:
            absent = {t.name for t in self.mv.config.inputs if t.name not in inputs}
            _Frame(self, None, inputs, on_free).start(absent)

    def abort(self) -> None:
        """Stop without reporting: every running step is cancelled, every frame let go."""
        if self.finished:
            return
        self.finished = True
        works, self._works = self._works, set()
        for work in works:
            work.closed = True  # a decoupled step's later responses are released as they come
            work.cancel()
            if work.stream is not None and work.on_final is not None:  # its trace's end
                on_final, work.on_final = work.on_final, None
                on_final()
        nested, self._nested = self._nested, set()
        for run in nested:
            run.abort()
        frames, self.frames = self.frames, set()
        for frame in frames:
            frame.unref()
        self.end_trace()

    def end_trace(self) -> None:
        trace, self.trace = self.trace, None
        traced.end(trace)

    def fail(self, error: BaseException) -> None:
        if not self.finished:
            self.abort()
            self._end(error)

    def frame_done(self, frame: _Frame) -> None:
        self.frames.discard(frame)
        if self.frames or self.finished:
            return
        self.finished = True
        self.end_trace()
        if self.emitted == 0 and not self.mv.config.decoupled:  # Triton's words
            self._end(
                InvalidArgument(
                    f"in ensemble '{self.mv.name}', unexpected deadlock, at least one output is "
                    "not set while no more ensemble steps can be made"
                )
            )
        else:
            self._end(None)

    def emit(self, frame: _Frame) -> None:
        frame.refs += 1
        self.emitted += 1
        tensors = frame.tensors
        self._emit({name: tensors[name] for name in self.wanted if name in tensors}, frame.unref)

    # -- steps ------------------------------------------------------------------------------

    def start_step(self, frame: _Frame, step: StepPlan) -> None:
        target = self.runner.models.resolve(step.model_name, step.version)
        if target.name in self.chain:  # refused at load; a later reload must not make it loop
            raise InvalidArgument(
                f"ensemble '{self.mv.name}' reaches itself through its step '{target.name}'"
            )
        inputs = step_inputs(self.mv.name, step, target, frame.tensors, self.base.request_id)
        started = time.monotonic_ns()
        batch = batch_of(target.summary.max_batch_size, [t.shape for t in inputs])
        frame.running += 1
        if target.config.is_ensemble:
            self._start_nested(frame, step, target, inputs, batch, started)
            return
        spilled: list[Block] = []
        if inline_bytes(inputs) > target.summary.inline_budget:
            spilled = spill_inline(inputs, self.runner.input_arena)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        work = Work(step_record(self.base, step, inputs), spilled, future, batch_size=batch)
        self._works.add(work)
        if target.config.decoupled:
            work.stream = _Relay(functools.partial(self._streamed, frame, step, target, work))
        else:
            future.add_done_callback(
                functools.partial(self._plain_done, frame, step, target, batch, started, work)
            )
        if self.trace is not None:
            self._trace_step(target, work, started)
        target.submit(work)

    def _trace_step(self, target: ModelVersion, work: Work, started: int) -> None:
        """A step's trace, a child of the request's: a plain step's ends with its answer, a
        decoupled one's with its final response."""
        assert self.trace is not None
        trace = self.trace.child(target.name, target.version, self.base.request_id)
        trace.stamp("REQUEST_START", started)
        trace.stamp("QUEUE_START", work.enqueued_ns)
        if work.stream is None:
            traced.follow(trace, work, self.runner.input_view)
        else:
            work.on_final = functools.partial(traced.end, trace)

    def _plain_done(
        self,
        frame: _Frame,
        step: StepPlan,
        target: ModelVersion,
        batch: int,
        started: int,
        work: Work,
        future: asyncio.Future[Completion],
    ) -> None:
        self._works.discard(work)
        if future.cancelled():  # by abort(), or by whoever else cancels work
            self.fail(asyncio.CancelledError())
            return
        error = future.exception()
        elapsed = time.monotonic_ns() - started
        if error is None:
            done = future.result()
            if self.finished:
                done.release()
                return
            if done.response.error is None:
                frame.releases.append(done.release)
                target.stats.success(batch, elapsed, done.queue_ns, done.compute_ns)
                target.stats.first_response(elapsed)
                self.times.add(done.compute_ns)
                frame.running -= 1
                frame.produced(step, {o.name: o for o in done.response.outputs})
                return
            done.release()
            error = self._step_error(done)
        count_failure(target, elapsed, error)
        self.fail(in_ensemble(self.mv.name, error))

    def _streamed(
        self, frame: _Frame, step: StepPlan, target: ModelVersion, work: Work, item: _Item
    ) -> None:
        """One item of a decoupled step's stream (its statistics are its instance's)."""
        if isinstance(item, Completion):
            if self.finished:
                item.release()
            elif item.response.error is not None:
                item.release()
                self.fail(self._step_error(item))
            else:
                outputs = {o.name: o for o in item.response.outputs}
                frame.open(step, outputs, item.release)
        elif isinstance(item, BaseException):  # its stub died
            self.fail(in_ensemble(self.mv.name, item))
        else:  # its final flag: every response of it has run on
            self._works.discard(work)
            if not self.finished:
                frame.running -= 1
                frame.settle()

    def _step_error(self, done: Completion) -> ModelError:
        assert done.response.error is not None
        return step_error(self.mv.name, done.response.error)

    def _start_nested(
        self,
        frame: _Frame,
        step: StepPlan,
        target: ModelVersion,
        inputs: list[TensorDesc],
        batch: int,
        started: int,
    ) -> None:
        """A step that is an ensemble: its responses are the step's, as a decoupled model's
        (or a plain one's, when it is not decoupled)."""
        run = StreamRun(
            self.runner,
            target,
            self.base,
            step.requested,
            self.chain,
            functools.partial(self._nested_emit, frame, step, target),
            lambda error: self._nested_end(run, frame, target, batch, started, error),
        )
        self._nested.add(run)
        if self.trace is not None:
            run.trace = self.trace.child(target.name, target.version, self.base.request_id)
            run.trace.stamp("REQUEST_START", started)
        # Started on the next turn, so that its end never runs inside this frame's advance.
        asyncio.get_running_loop().call_soon(run.start, {d.name: d for d in inputs})

    def _nested_emit(
        self,
        frame: _Frame,
        step: StepPlan,
        target: ModelVersion,
        tensors: _Tensors,
        release: Callable[[], None],
    ) -> None:
        if self.finished:
            release()
        elif target.config.decoupled:
            frame.open(step, tensors, release)
        else:
            frame.releases.append(release)
            frame.produced(step, tensors)  # (the step still runs: it ends with its run)

    def _nested_end(
        self,
        run: StreamRun,
        frame: _Frame,
        target: ModelVersion,
        batch: int,
        started: int,
        error: BaseException | None,
    ) -> None:
        self._nested.discard(run)
        elapsed = time.monotonic_ns() - started
        if error is not None:
            count_failure(target, elapsed, error)
            self.fail(error)
            return
        count_success(target, batch, elapsed, run.times)
        self.times.add(run.times.total())
        if not self.finished:
            frame.running -= 1
            frame.settle()


class _Frame:
    """The tensors of one response of a decoupled step (of the request, for the first frame)
    and of the steps they run."""

    def __init__(
        self,
        run: StreamRun,
        parent: _Frame | None,
        tensors: _Tensors,
        on_free: Callable[[], None] | None,
    ) -> None:
        self.run = run
        self.parent = parent
        self.tensors = tensors
        #: What gives back the blocks this frame's tensors lie in.
        self.releases: list[Callable[[], None]] = []
        #: Its own (while steps may run in it), its response's, and its child frames'.
        self.refs = 1
        self.running = 0
        self.sent = False
        self._on_free = on_free
        #: Per step: input tensors still missing here; -1 once the step has started.
        #: A step whose outputs the request does not need never starts (Triton prunes it).
        needed = needed_steps(run.plan, run.wanted)
        self._missing = [s.needs if s.index in needed else -1 for s in run.plan.steps]
        #: Tensors that will never be here (an optional input not given, an output its step did
        #: not make): as in Triton, their consumers run without them.
        self.absent: set[str] = set()
        run.frames.add(self)
        if parent is not None:
            parent.refs += 1

    def start(self, absent: set[str]) -> None:
        self.absent = absent
        self._advance(self._arrived([*self.tensors, *absent]))

    def _arrived(self, names: list[str]) -> list[StepPlan]:
        """Each tensor now here (or known absent) is one fewer that its consumers wait for:
        those that wait for none any more."""
        ready = []
        for name in names:
            for step in self.run.plan.consumers.get(name, ()):
                self._missing[step.index] -= 1
                if self._missing[step.index] == 0:
                    ready.append(step)
        return ready

    def open(self, step: StepPlan, outputs: _Tensors, release: Callable[[], None]) -> None:
        """One response of decoupled ``step`` (run in this frame): a frame of its own."""
        run = self.run
        if len(run.frames) >= BACKLOG_MAX:
            # A decoupled step faster than the steps after it: each response waits as a frame
            # in the core (Triton's max_inflight_requests pauses the model's sender, which a
            # stub's cannot be), so the request ends rather than the core's memory growing.
            release()
            run.fail(
                ResourceExhausted(
                    f"in ensemble '{run.mv.name}', {len(run.frames)} responses of step "
                    f"'{step.model_name}' wait for the later steps (at most {BACKLOG_MAX} may): "
                    "the stream is ended and the request cancelled"
                )
            )
            return
        tensors = {step.output_map[n]: d for n, d in outputs.items() if n in step.output_map}
        child = _Frame(self.run, self, tensors, None)
        child.releases.append(release)
        child.start({t for t in step.output_map.values() if t not in tensors})

    def produced(self, step: StepPlan, outputs: _Tensors) -> None:
        """A plain step's outputs, stored under their ensemble names (those it did not make
        are absent); start what they free."""
        arrived = []
        for name, target in step.output_map.items():
            if target in self.tensors or target in self.absent:
                continue
            desc = outputs.get(name)
            if desc is None:
                self.absent.add(target)
            else:
                self.tensors[target] = desc
            arrived.append(target)
        self._advance(self._arrived(arrived))

    def _advance(self, ready: list[StepPlan]) -> None:
        run = self.run
        try:
            for step in sorted(ready, key=lambda s: s.index):
                if run.finished:
                    return
                self._missing[step.index] = -1
                run.start_step(self, step)
            if not (self.sent or run.finished) and all(self._has(n) for n in run.wanted):
                self.sent = True
                run.emit(self)
        except Exception as error:  # a step that cannot start fails the request
            run.fail(error)
            return
        self.settle()

    def _has(self, name: str) -> bool:
        return name in self.tensors or name in self.absent

    def settle(self) -> None:
        """No step runs here any more: no other can start, the frame lets its blocks go."""
        if self.running or self not in self.run.frames:
            return
        self.unref()
        self.run.frame_done(self)

    def unref(self) -> None:
        self.refs -= 1
        if self.refs:
            return
        releases, self.releases = self.releases, []
        for release in releases:
            release()
        if self._on_free is not None:
            self._on_free()
        if self.parent is not None:
            self.parent.unref()
