"""Ensembles: a DAG of model steps run inside the supervisor.

A step starts as soon as all of its input tensors exist, so independent steps run in parallel.
Intermediate tensors stay where the producing stub wrote them and are handed to the consuming
stub by descriptor (the segment directory sends it the segment's fd): no copy between steps.
Every block stays alive until the ensemble's response is released. A step may itself be an
ensemble: its steps run inside the outer request (their blocks held by it too), and the nested
ensemble's statistics count it as one request, as its step models count theirs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from shoal.ipc.arena import Block
from shoal.ipc.messages import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.errors import ErrorCode, InvalidArgument, ModelError, ShoalError
from shoal.supervisor.models import ModelVersion
from shoal.supervisor.segments import SegmentDirectory
from shoal.supervisor.staging import batch_of
from shoal.supervisor.stats import ComputeNs
from shoal.supervisor.types import InferOutput, InferRequest, InferResponse
from shoal.supervisor.work import Completion, Work


class VersionResolver(Protocol):
    def resolve(self, name: str, version: str) -> ModelVersion: ...


class EnsembleRunner:
    """Runs one ensemble request over the composing models' schedulers."""

    def __init__(
        self,
        models: VersionResolver,
        directory: SegmentDirectory,
        free_inputs: Callable[[list[Block]], None],
    ) -> None:
        self._models = models
        self._directory = directory
        self._free_inputs = free_inputs

    async def run(
        self,
        mv: ModelVersion,
        request: InferRequest,
        record: RequestRecord,
        blocks: list[Block],
    ) -> InferResponse:
        """``record`` holds the staged client inputs; ``blocks`` are freed with the response."""
        completions: list[Completion] = []

        def release() -> None:
            for completion in completions:
                completion.release()
            completions.clear()
            self._free_inputs(blocks)

        try:
            tensors = await self._run_steps(mv, record, completions)
            outputs = [self._output(mv, tensors, name) for name in record.requested_outputs]
        except BaseException:
            release()
            raise
        return InferResponse(
            model_name=mv.name,
            model_version=str(mv.version),
            id=request.id,
            outputs=outputs,
            _release=release,
        )

    async def _run_steps(
        self,
        mv: ModelVersion,
        record: RequestRecord,
        completions: list[Completion],
        chain: tuple[str, ...] = (),
    ) -> dict[str, TensorDesc]:
        """Run ``mv``'s steps; every step's completion (nested ones too) joins ``completions``.
        ``chain``: the ensembles this one is nested in."""
        steps = list(mv.config.ensemble_steps)
        tensors = {desc.name: desc for desc in record.inputs}
        waiting = set(range(len(steps)))
        running: dict[asyncio.Task[list[TensorDesc]], int] = {}
        chain = (*chain, mv.name)
        try:
            while waiting or running:
                for index in sorted(waiting):
                    if all(t in tensors for t in steps[index].input_map.values()):
                        waiting.discard(index)
                        step = self._step(mv, steps[index], tensors, record, completions, chain)
                        running[asyncio.create_task(step)] = index
                if not running:
                    raise InvalidArgument(self._stuck(mv, steps, waiting, tensors))
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = steps[running.pop(task)]
                    for output in task.result():
                        target = step.output_map.get(output.name)
                        if target is not None:
                            tensors[target] = TensorDesc(
                                target, output.datatype, output.shape, output.location
                            )
        finally:
            for task in running:
                task.cancel()
            # A cancelled step still puts what it received into ``completions``.
            await asyncio.gather(*running, return_exceptions=True)
        return tensors

    @staticmethod
    def _stuck(
        mv: ModelVersion, steps: list[Any], waiting: set[int], tensors: dict[str, Any]
    ) -> str:
        missing = sorted(
            {t for i in waiting for t in steps[i].input_map.values() if t not in tensors}
        )
        return (
            f"ensemble '{mv.name}' cannot run steps {sorted(waiting)}: tensors "
            f"{missing} were never produced (an optional input was not given?)"
        )

    async def _step(
        self,
        mv: ModelVersion,
        step: Any,
        tensors: dict[str, TensorDesc],
        parent: RequestRecord,
        completions: list[Completion],
        chain: tuple[str, ...],
    ) -> list[TensorDesc]:
        """Run one step; its outputs, by the step model's output names."""
        version = "" if step.model_version < 0 else str(step.model_version)
        target = self._models.resolve(step.model_name, version)
        if target.name in chain:  # refused at load; a later reload must not make it loop
            raise InvalidArgument(
                f"ensemble '{mv.name}' reaches itself through its step '{target.name}'"
            )
        inputs = [
            self._step_input(mv, target, name, tensors[source])
            for name, source in step.input_map.items()
        ]
        record = RequestRecord(
            request_id=parent.request_id,
            correlation_id=parent.correlation_id,
            flags=parent.flags,
            parameters=parent.parameters,
            requested_outputs=list(step.output_map),
            inputs=inputs,
            timeout_us=parent.timeout_us,
        )
        started = time.monotonic_ns()
        batch = batch_of(target.config, [t.shape for t in inputs])
        try:
            if target.config.is_ensemble:
                outputs = await self._nested(target, record, completions, chain)
                timings: tuple[int, ComputeNs] = (0, (0, 0, 0))
            else:
                completion = await self._model_step(mv, target, record, batch)
                completions.append(completion)
                outputs = [
                    TensorDesc(o.name, o.datatype, o.shape, o.location)
                    for o in completion.response.outputs
                ]
                timings = (completion.queue_ns, completion.compute_ns)
        except ShoalError as error:
            target.stats.failure(time.monotonic_ns() - started, error.reason)
            raise
        target.stats.success(batch, time.monotonic_ns() - started, *timings)
        return outputs

    async def _model_step(
        self,
        mv: ModelVersion,
        target: ModelVersion,
        record: RequestRecord,
        batch: int,
    ) -> Completion:
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        # The inputs belong to the ensemble request: the step's work owns no block.
        target.submit(Work(record, [], future, batch_size=batch))
        completion = await future
        if completion.response.error is not None:
            completion.release()
            code, message = completion.response.error
            raise ModelError(
                f"in ensemble '{mv.name}', step '{target.name}': {message}",
                ErrorCode.__members__.get(code, ErrorCode.INTERNAL),
            )
        return completion

    async def _nested(
        self,
        target: ModelVersion,
        record: RequestRecord,
        completions: list[Completion],
        chain: tuple[str, ...],
    ) -> list[TensorDesc]:
        """A step that is an ensemble: its steps run here, their blocks held by the outer
        request like any other step's; its outputs pass on by descriptor."""
        tensors = await self._run_steps(target, record, completions, chain)
        missing = [name for name in record.requested_outputs if name not in tensors]
        if missing:
            raise InvalidArgument(f"ensemble '{target.name}' produced no tensor {missing}")
        return [tensors[name] for name in record.requested_outputs]

    @staticmethod
    def _step_input(
        mv: ModelVersion, target: ModelVersion, name: str, source: TensorDesc
    ) -> TensorDesc:
        spec = next((t for t in target.config.inputs if t.name == name), None)
        if spec is None:
            raise InvalidArgument(
                f"ensemble '{mv.name}' maps tensor '{source.name}' to input '{name}', which "
                f"model '{target.name}' does not have"
            )
        if spec.datatype != source.datatype:
            raise InvalidArgument(
                f"ensemble '{mv.name}': tensor '{source.name}' is {source.datatype} but input "
                f"'{name}' of model '{target.name}' expects {spec.datatype}"
            )
        return TensorDesc(name, source.datatype, source.shape, source.location)

    def _output(self, mv: ModelVersion, tensors: dict[str, TensorDesc], name: str) -> InferOutput:
        desc = tensors.get(name)
        if desc is None:
            raise InvalidArgument(f"ensemble '{mv.name}' produced no tensor '{name}'")
        assert isinstance(desc.location, Block)
        view = self._directory.view(desc.location)
        return InferOutput(name, desc.datatype, desc.shape, view)
