"""Ensembles: a DAG of model steps run inside the supervisor.

A step starts as soon as all of its input tensors exist, so independent steps run in parallel.
Intermediate tensors stay where the producing stub wrote them and are handed to the consuming
stub by descriptor (the segment directory sends it the segment's fd): no copy between steps.
Every block stays alive until the ensemble's response is released. A step may itself be an
ensemble: its steps run inside the outer request (their blocks held by it too), and the nested
ensemble's statistics count it as one request, as its step models count theirs.

A request is driven by callbacks rather than by a task per step: the done-callback of a step's
future stores the step's outputs and submits the steps they complete at once, so the next step
reaches its model's scheduler in the event-loop turn that delivered the previous step's result.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Protocol

from shoal.core.errors import InvalidArgument, ShoalError
from shoal.core.types import InferOutput, InferRequest, InferResponse
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import CudaLocation, InlineBytes, TensorDesc
from shoal.supervisor.extensions.trace_files import Trace
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.models._ensemble_outcomes import (
    StepTimes,
    count_failure,
    count_success,
    in_ensemble,
    made_outputs,
    sequence_parameters,
    step_error,
    step_inputs,
    step_record,
)
from shoal.supervisor.models._ensemble_plan import (
    EnsemblePlan,
    StepPlan,
    needed_steps,
    plan_of,
)
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests import traced
from shoal.supervisor.requests.staging import batch_of, inline_bytes, spill_inline
from shoal.supervisor.requests.traced_tensors import trace_inputs, trace_named
from shoal.supervisor.work import Completion, Work

_Tensors = dict[str, TensorDesc]

#: Called once when a graph ends: its tensors, or the error that ended it.
OnDone = Callable[[dict[str, TensorDesc] | None, BaseException | None], None]


class VersionResolver(Protocol):
    def resolve(self, name: str, version: str) -> ModelVersion: ...


class EnsembleRunner:
    """Runs one ensemble request over the composing models' schedulers."""

    def __init__(
        self,
        models: VersionResolver,
        directory: SegmentDirectory,
        free_inputs: Callable[[list[Block]], None],
        tracing: TraceSettings | None = None,
    ) -> None:
        self.models = models
        self._directory = directory
        self._free_inputs = free_inputs
        #: Where a traced request's trace begins (None: no traces, in unit tests).
        self.tracing = tracing

    @property
    def input_arena(self) -> OwnedArena:
        return self._directory.input_arena

    def input_view(self, block: Block) -> memoryview:
        """A step's input block, read for its trace (level TENSORS)."""
        return self._directory.view(block)

    def plan(self, mv: ModelVersion) -> EnsemblePlan:
        """The step graph of a loaded ensemble version, worked out on its first request."""
        plan: EnsemblePlan | None = mv.ensemble_plan
        if plan is None:
            plan = mv.ensemble_plan = plan_of(mv.config)
        return plan

    async def run(
        self,
        mv: ModelVersion,
        request: InferRequest,
        record: RequestRecord,
        blocks: list[Block],
        started: int = 0,
        batch: int = 1,
        finish: Callable[[InferResponse], None] | None = None,
    ) -> InferResponse:
        """``record`` holds the staged client inputs; ``blocks`` are freed with the response;
        ``started``, ``batch``: the request's start (and its trace's) and its batch size;
        ``finish``: what the response goes through before it counts as a success (caching,
        classification): where it raises, the request is one failure, counted by the caller
        (the response given back by ``finish``)."""
        completions: list[Completion] = []
        release = functools.partial(self._release, completions, blocks)
        trace = None if self.tracing is None else traced.begin(self.tracing, mv, record, started)
        if trace is not None and trace.tensors:  # as a model's request does, as in Triton
            trace_inputs(trace, record, self.input_view)
        try:
            outputs, times = await self._run_graph(mv, record, completions, release, trace)
        finally:
            traced.end(trace)
        response = InferResponse(
            model_name=mv.name,
            model_version=str(mv.version),
            id=request.id,
            outputs=outputs,
            parameters=sequence_parameters(record),
            _release=release,
        )
        if finish is not None:
            finish(response)
        elapsed = time.monotonic_ns() - started
        count_success(mv, batch, elapsed, times)
        mv.stats.first_response(elapsed)  # its one response
        return response

    async def _run_graph(
        self,
        mv: ModelVersion,
        record: RequestRecord,
        completions: list[Completion],
        release: Callable[[], None],
        trace: Trace | None,
    ) -> tuple[list[InferOutput], StepTimes]:
        """The ensemble's requested outputs; on any failure (the client went away too) the
        steps still queued are dropped and everything held is released."""
        done: asyncio.Future[dict[str, TensorDesc]] = asyncio.get_running_loop().create_future()
        inputs = {desc.name: desc for desc in record.inputs}
        wanted = tuple(record.requested_outputs)
        graph = _Graph(
            self, mv, record, inputs, wanted, completions, (), functools.partial(_settle, done)
        )
        graph.trace = trace
        try:
            graph.start()
            tensors = await done
            made = made_outputs(mv.name, record.requested_outputs, tensors)
            if trace is not None and trace.tensors:
                outputs = {name: tensors[name] for name in made}
                trace_named(trace, "TENSOR_BACKEND_OUTPUT", outputs, self.input_view)
            return [self.output(mv, tensors, name) for name in made], graph.times
        except BaseException:
            graph.abort()
            release()
            raise

    def free_inputs(self, blocks: list[Block]) -> None:
        """Give back the staged client inputs of a request."""
        self._free_inputs(blocks)

    def _release(self, completions: list[Completion], blocks: list[Block]) -> None:
        for completion in completions:
            completion.release()
        completions.clear()
        self._free_inputs(blocks)

    def output(self, mv: ModelVersion, tensors: dict[str, TensorDesc], name: str) -> InferOutput:
        """Ensemble tensor ``name`` as an output of its response (read in place)."""
        desc = tensors.get(name)
        if desc is None:
            raise InvalidArgument(f"ensemble '{mv.name}' produced no tensor '{name}'")
        if type(desc.location) is InlineBytes:
            return InferOutput(name, desc.datatype, desc.shape, memoryview(desc.location.data))
        assert isinstance(desc.location, Block | CudaLocation)
        view = self._directory.view(desc.location)
        placed = desc.location if type(desc.location) is Block else None
        return InferOutput(name, desc.datatype, desc.shape, view, placed=placed)


def _settle(
    done: asyncio.Future[dict[str, TensorDesc]],
    tensors: dict[str, TensorDesc] | None,
    error: BaseException | None,
) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(tensors or {})


class _Graph:
    """The steps of one ensemble within one request; a nested ensemble gets a graph of its own.

    ``tensors`` maps ensemble tensor names to descriptors (whose own names may be the producing
    model's). Every step's completion joins ``completions``, which the request releases.
    """

    def __init__(
        self,
        runner: EnsembleRunner,
        mv: ModelVersion,
        base: RequestRecord,
        tensors: dict[str, TensorDesc],
        wanted: tuple[str, ...],
        completions: list[Completion],
        chain: tuple[str, ...],
        on_done: OnDone,
    ) -> None:
        self._runner = runner
        self.mv = mv
        self._base = base
        self._plan = runner.plan(mv)
        self.tensors = tensors
        #: Tensors that will never be there (an optional input not given, an output its step
        #: did not make): as in Triton, their consumers run without them.
        self.absent: set[str] = set()
        self._completions = completions
        self._chain = (*chain, mv.name)  # this ensemble and those it is nested in
        self._on_done = on_done
        #: Per step: input tensors still missing; -1 once the step has started, or for a step
        #: whose outputs the request does not need.
        needed = needed_steps(self._plan, wanted)
        self._missing = [s.needs if s.index in needed else -1 for s in self._plan.steps]
        self._running: dict[int, asyncio.Future[Completion] | _Graph] = {}
        self._finished = False
        #: The trace of the request (or nested step) this graph runs; its steps' are children.
        self.trace: Trace | None = None
        self.times = StepTimes()

    # -- driving ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._finished:  # aborted before a deferred start
            return
        self.absent.update(t.name for t in self.mv.config.inputs if t.name not in self.tensors)
        for name in (*self.tensors, *self.absent):  # one fewer that its consumers wait for
            for step in self._plan.consumers.get(name, ()):
                self._missing[step.index] -= 1
        self._advance([step for step in self._plan.steps if self._missing[step.index] == 0])

    def abort(self) -> None:
        """Stop without reporting: queued steps are dropped, running ones' results released."""
        self._finished = True
        running, self._running = self._running, {}
        for item in running.values():
            if isinstance(item, _Graph):
                item.abort()
            else:
                item.cancel()

    def _fail(self, error: BaseException) -> None:
        if not self._finished:
            self.abort()
            self._on_done(None, error)

    def _advance(self, ready: list[StepPlan]) -> None:
        """Start the steps whose inputs all exist (in step order), then see if all is done."""
        try:
            self._start_all(ready)
        except Exception as error:  # a step that cannot start fails the request
            self._fail(error)
            return
        if self._finished or self._running:
            return
        if any(m >= 0 for m in self._missing):
            self._fail(InvalidArgument(self._stuck()))
        else:
            self._finished = True
            self._on_done(self.tensors, None)

    def _start_all(self, ready: list[StepPlan]) -> None:
        for step in ready:
            if self._finished:
                return
            self._missing[step.index] = -1
            self._start(step)

    def _produced(self, step: StepPlan, outputs: list[tuple[str, TensorDesc]]) -> None:
        """Store a finished step's outputs under their ensemble names (those it did not make
        are absent); start what they free."""
        made = {step.output_map[name]: desc for name, desc in outputs if name in step.output_map}
        ready = []
        for target in step.output_map.values():
            if target in self.tensors or target in self.absent:
                continue
            desc = made.get(target)
            if desc is None:
                self.absent.add(target)
            else:
                self.tensors[target] = desc
            for consumer in self._plan.consumers.get(target, ()):
                self._missing[consumer.index] -= 1
                if self._missing[consumer.index] == 0:
                    ready.append(consumer)
        ready.sort(key=lambda s: s.index)
        self._advance(ready)

    def _stuck(self) -> str:
        waiting = [s for s in self._plan.steps if self._missing[s.index] >= 0]
        missing = sorted({t for s in waiting for _, t in s.inputs if t not in self.tensors})
        return (  # Triton's words; absent tensors free their consumers, so never expected
            f"in ensemble '{self.mv.name}', unexpected deadlock, at least one output is not set "
            f"while no more ensemble steps can be made (steps {[s.index for s in waiting]} "
            f"wait for tensors {missing})"
        )

    # -- one step ---------------------------------------------------------------------------

    def _start(self, step: StepPlan) -> None:
        target = self._runner.models.resolve(step.model_name, step.version)
        if target.name in self._chain:  # refused at load; a later reload must not make it loop
            raise InvalidArgument(
                f"ensemble '{self.mv.name}' reaches itself through its step '{target.name}'"
            )
        if target.config.decoupled:  # the ensemble loaded as decoupled otherwise
            raise InvalidArgument(
                f"ensemble '{self.mv.name}' loaded when its step model '{target.name}' was not "
                "decoupled, and it is now: load the ensemble again"
            )
        inputs = step_inputs(self.mv.name, step, target, self.tensors, self._base.request_id)
        started = time.monotonic_ns()
        batch = batch_of(target.summary.max_batch_size, [t.shape for t in inputs])
        if target.config.is_ensemble:
            self._start_nested(step, target, inputs, batch, started)
            return
        spilled: list[Block] = []
        if inline_bytes(inputs) > target.summary.inline_budget:
            spilled = spill_inline(inputs, self._runner.input_arena)
        record = step_record(self._base, step, inputs)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._running[step.index] = future
        future.add_done_callback(functools.partial(self._model_done, step, target, batch, started))
        # The inputs belong to the ensemble request: the step's work owns only the blocks
        # made for it here.
        work = Work(record, spilled, future, batch_size=batch)
        if self.trace is not None:
            self._trace_step(target, work, started)
        target.submit(work)

    def _trace_step(self, target: ModelVersion, work: Work, started: int) -> None:
        assert self.trace is not None
        trace = self.trace.child(target.name, target.version, self._base.request_id)
        trace.stamp("REQUEST_START", started)
        trace.stamp("QUEUE_START", work.enqueued_ns)
        traced.follow(trace, work, self._runner.input_view)

    def _model_done(
        self,
        step: StepPlan,
        target: ModelVersion,
        batch: int,
        started: int,
        future: asyncio.Future[Completion],
    ) -> None:
        self._running.pop(step.index, None)
        if future.cancelled():  # by abort(), or by whoever else cancels work
            self._fail(asyncio.CancelledError())
            return
        error = future.exception()
        if error is None:
            error = self._completed(step, target, batch, started, future.result())
            if error is None:
                return
        count_failure(target, time.monotonic_ns() - started, error)
        self._fail(in_ensemble(self.mv.name, error))

    def _completed(
        self, step: StepPlan, target: ModelVersion, batch: int, started: int, done: Completion
    ) -> ShoalError | None:
        """A step's response arrived: its outputs flow on, or its error fails the request."""
        if self._finished:
            done.release()
            return None
        if done.response.error is None:
            self._completions.append(done)
            elapsed = time.monotonic_ns() - started
            target.stats.success(batch, elapsed, done.queue_ns, done.compute_ns)
            target.stats.first_response(elapsed)
            self.times.add(done.compute_ns)
            self._produced(step, [(o.name, o) for o in done.response.outputs])
            return None
        done.release()
        return step_error(self.mv.name, done.response.error)

    def _start_nested(
        self,
        step: StepPlan,
        target: ModelVersion,
        inputs: list[TensorDesc],
        batch: int,
        started: int,
    ) -> None:
        """A step that is an ensemble: its steps run here, their blocks held by the outer
        request like any other step's; its outputs pass on by descriptor."""
        done = functools.partial(self._nested_done, step, target, batch, started)
        child = _Graph(
            self._runner,
            target,
            self._base,
            {desc.name: desc for desc in inputs},
            step.requested,
            self._completions,
            self._chain,
            done,
        )
        if self.trace is not None:
            child.trace = self.trace.child(target.name, target.version, self._base.request_id)
            child.trace.stamp("REQUEST_START", started)
            trace_named(child.trace, "TENSOR_QUEUE_INPUT", child.tensors, self._runner.input_view)
        self._running[step.index] = child
        # Started on the next turn, so that its end never runs inside this graph's _advance.
        asyncio.get_running_loop().call_soon(child.start)

    def _nested_done(
        self,
        step: StepPlan,
        target: ModelVersion,
        batch: int,
        started: int,
        tensors: dict[str, TensorDesc] | None,
        error: BaseException | None,
    ) -> None:
        nested = self._running.pop(step.index, None)
        if isinstance(nested, _Graph) and nested.trace is not None:
            out = {n: tensors[n] for n in step.requested if n in tensors} if tensors else {}
            trace_named(nested.trace, "TENSOR_BACKEND_OUTPUT", out, self._runner.input_view)
            nested.trace.stamp("REQUEST_END")
            nested.trace.finish()
        elapsed = time.monotonic_ns() - started
        if error is not None or tensors is None:
            count_failure(target, elapsed, error)
            self._fail(error or asyncio.CancelledError())
            return
        times = nested.times if isinstance(nested, _Graph) else StepTimes()
        count_success(target, batch, elapsed, times)
        target.stats.first_response(elapsed)
        self.times.add(times.total())
        if not self._finished:
            # An output the nested ensemble did not make is absent, as a model's would be.
            made = [(name, tensors[name]) for name in step.requested if name in tensors]
            self._produced(step, made)
