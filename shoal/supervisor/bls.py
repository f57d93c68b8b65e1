"""BLS calls from stubs: a model's ``InferenceRequest.exec()`` enters the target model's
scheduler like any request. Tensors pass by descriptor both ways (the caller receives the fds of
the target's output segments); the target's blocks stay reserved until the caller drops the
response (``BlsDone``) or dies. A cancelled call (``BlsCancel``: the caller's own request was
cancelled, or the model called ``ResponseIterator.cancel()``) cancels the target's request as a
client's cancel would, and answers the caller at once with a CANCELLED error."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.supervisor import staging
from shoal.supervisor.errors import (
    Cancelled,
    DeadlineExceeded,
    ModelError,
    ShoalError,
    Unavailable,
    Unsupported,
)
from shoal.supervisor.models import ModelVersion
from shoal.supervisor.segments import SegmentDirectory
from shoal.supervisor.streams import new_stream
from shoal.supervisor.types import InferInput, InferRequest, RequestedOutput
from shoal.supervisor.work import Completion, Work

if TYPE_CHECKING:
    from shoal.supervisor.instances import StubInstance
    from shoal.supervisor.stub_process import StubProcess

log = logging.getLogger("shoal")


class VersionResolver(Protocol):
    def resolve(self, name: str, version: str) -> ModelVersion: ...


class BlsRouter:
    """Runs BLS calls and holds the called models' output blocks until the caller is done."""

    def __init__(self, models: VersionResolver, directory: SegmentDirectory) -> None:
        self._models = models
        self._directory = directory
        self._held: dict[tuple[int, int], list[Completion]] = {}  # (caller pid, call) -> ...
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._cancelled: set[tuple[int, int]] = set()

    def handle(self, caller: StubInstance, proc: StubProcess, call: msg.BlsCall) -> None:
        key = (proc.pid, call.call_id)
        task = asyncio.create_task(self._serve(caller, proc, call), name=f"bls {call.call_id}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._finished(key))

    def _finished(self, key: tuple[int, int]) -> None:
        self._tasks.pop(key, None)
        self._cancelled.discard(key)

    def cancel(self, proc: StubProcess, call_id: int) -> None:
        """Cancel a call still running (a finished one is left alone)."""
        key = (proc.pid, call_id)
        task = self._tasks.get(key)
        if task is not None and not task.done() and key not in self._cancelled:
            self._cancelled.add(key)
            task.cancel()

    def done(self, proc: StubProcess, call_id: int) -> None:
        for completion in self._held.pop((proc.pid, call_id), []):
            completion.release()

    def forget_process(self, proc: StubProcess) -> None:
        for key in [k for k in self._held if k[0] == proc.pid]:
            for completion in self._held.pop(key):
                completion.release()

    async def _serve(self, caller: StubInstance, proc: StubProcess, call: msg.BlsCall) -> None:
        try:
            target = self._target(caller, call)
            timeout = call.request.timeout_us / 1e6 if call.request.timeout_us > 0 else None
            await asyncio.wait_for(self._run(target, proc, call), timeout)
        except asyncio.CancelledError:
            if (proc.pid, call.call_id) not in self._cancelled:
                raise  # shutdown, not a BLS cancel
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            await self._reply_error(
                proc, call, Cancelled(f"BLS request to model '{call.model_name}' was cancelled")
            )
        except asyncio.TimeoutError:
            await self._reply_error(proc, call, DeadlineExceeded("Request timeout expired"))
        except ShoalError as error:
            await self._reply_error(proc, call, error)
        except Exception as error:  # a bug must answer the caller, not leave it waiting
            log.exception("BLS call from '%s' failed", caller.name)
            await self._reply_error(proc, call, ShoalError(f"internal error in BLS: {error!r}"))

    def _target(self, caller: StubInstance, call: msg.BlsCall) -> ModelVersion:
        version = "" if call.model_version < 0 else str(call.model_version)
        target = self._models.resolve(call.model_name, version)
        if target.config.is_ensemble:
            raise Unsupported(
                f"BLS calls to ensemble '{target.name}' are not supported yet; call its steps"
            )
        if call.decoupled != target.config.decoupled:
            kind = "decoupled" if target.config.decoupled else "not decoupled"
            raise Unsupported(
                f"model '{target.name}' is {kind}: call it with exec(decoupled="
                f"{target.config.decoupled})"
            )
        if caller in target.instances and not any(
            i is not caller and i.ready and not i.busy for i in target.instances
        ):
            raise Unavailable(
                f"BLS request from instance '{caller.name}' to its own model '{target.name}' "
                "would wait for itself: every other instance is busy or absent"
            )
        request = InferRequest(
            call.model_name,
            inputs=[InferInput(t.name, t.datatype, t.shape, b"") for t in call.request.inputs],
            outputs=[RequestedOutput(n) for n in call.request.requested_outputs],
        )
        staging.check_inputs(target.config, request)
        call.request.requested_outputs = staging.check_outputs(target.config, request)
        return target

    async def _run(self, target: ModelVersion, proc: StubProcess, call: msg.BlsCall) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        work = Work(
            call.request,
            [],
            future,
            batch_size=staging.batch_of(target.config, [t.shape for t in call.request.inputs]),
        )
        if call.decoupled:
            work.stream = new_stream()
        target.submit(work)
        held = self._held.setdefault((proc.pid, call.call_id), [])
        try:
            if work.stream is None:
                completion = await future
                held.append(completion)
                if completion.response.error is None:
                    target.stats.success(
                        work.batch_size,
                        time.monotonic_ns() - work.enqueued_ns,
                        completion.queue_ns,
                        completion.compute_ns,
                    )
                else:
                    target.stats.failure(time.monotonic_ns() - work.enqueued_ns, ModelError.reason)
                await self._reply(proc, call.call_id, completion.response, True)
                return
            while (item := await work.stream.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                held.append(item)
                await self._reply(proc, call.call_id, item.response, False)
            await self._reply(proc, call.call_id, None, True)
        except BaseException:
            _abandon(work, held)
            raise

    async def _reply(
        self, proc: StubProcess, call_id: int, body: msg.ResponseRecord | None, final: bool
    ) -> None:
        if body is not None:
            blocks = [o.location for o in body.outputs if isinstance(o.location, Block)]
            proc.forward(blocks, self._directory.fd)
        await proc.send_async(msg.BlsReply(call_id, body, final))

    async def _reply_error(self, proc: StubProcess, call: msg.BlsCall, error: ShoalError) -> None:
        body = msg.ResponseRecord(error=(error.code.name, error.message))
        try:
            await proc.send_async(msg.BlsReply(call.call_id, body, True))
        except Exception:
            pass  # the caller is gone


def _abandon(work: Work, held: list[Completion]) -> None:
    """The caller no longer waits: cancel the target's request (dropped if still queued, flagged
    to the model if running) and give back the responses nobody will read."""
    future = work.future
    arrived = future.done() and not future.cancelled() and future.exception() is None
    if arrived and future.result() not in held:  # it came as the call was being cancelled
        future.result().release()
    work.closed = True
    work.cancel()
    if work.stream is not None:
        while not work.stream.empty():
            item = work.stream.get_nowait()
            if isinstance(item, Completion):
                item.release()
