"""BLS calls from stubs: a model's ``InferenceRequest.exec()`` enters the target model's
scheduler like any request. Tensors pass by descriptor both ways (the caller receives the fds of
the target's output segments); the target's blocks stay reserved until the caller drops the
response (``BlsDone``) or dies. A cancelled call (``BlsCancel``: the caller's own request was
cancelled, or the model called ``ResponseIterator.cancel()``) cancels the target's request as a
client's cancel would. A decoupled model already running it decides how its stream ends (as in
Triton); any other call is answered at once with a CANCELLED error."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shoal.core.errors import (
    Cancelled,
    ModelError,
    ShoalError,
    Unavailable,
    Unsupported,
)
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.queue import PeerGone
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.instances.decoupled import new_stream
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests import staging, traced
from shoal.supervisor.work import Completion, Work

if TYPE_CHECKING:
    from shoal.supervisor.instances.channel import StubChannel
    from shoal.supervisor.instances.spec import Caller

log = logging.getLogger("shoal")


class VersionResolver(Protocol):
    def resolve(self, name: str, version: str) -> ModelVersion: ...


class BlsRouter:
    """Runs BLS calls and holds the called models' output blocks until the caller is done."""

    def __init__(
        self,
        models: VersionResolver,
        directory: SegmentDirectory,
        tracing: TraceSettings | None = None,
    ) -> None:
        self._models = models
        self._directory = directory
        #: Where a call made with its caller's trace finds it (None: no traces, unit tests).
        self._tracing = tracing
        self._held: dict[tuple[int, int], list[Completion]] = {}  # (caller pid, call) -> ...
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._cancelled: set[tuple[int, int]] = set()
        self._open: dict[tuple[int, int], _OpenCall] = {}  # calls with one response
        #: The request of each decoupled call to a decoupled model, once submitted.
        self._streaming: dict[tuple[int, int], Work] = {}
        self._sending: set[asyncio.Future[None]] = set()

    def handle(self, caller: Caller, proc: StubChannel, call: msg.BlsCall) -> None:
        key = (proc.pid, call.call_id)
        if not call.decoupled:
            self._start(caller, proc, call, key)
            return
        self._serve_in_task(caller, proc, call, key)

    def _serve_in_task(
        self, caller: Caller, proc: StubChannel, call: msg.BlsCall, key: tuple[int, int]
    ) -> None:
        caller.call_began(proc)
        task = asyncio.create_task(self._serve(caller, proc, call), name=f"bls {call.call_id}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._finished(key, caller, proc))

    def _finished(self, key: tuple[int, int], caller: Caller, proc: StubChannel) -> None:
        caller.call_ended(proc)
        self._tasks.pop(key, None)
        self._streaming.pop(key, None)
        self._cancelled.discard(key)

    def cancel(self, proc: StubChannel, call_id: int) -> None:
        """Cancel a call still running (a finished one is left alone).

        A decoupled model that has started the call's request only sees it cancelled
        (``is_cancelled()``), as in Triton: its responses keep coming to the caller's iterator
        until it sends FINAL, early (honouring the cancel) or not. Any other call ends at once
        with a CANCELLED error, its request dropped from the queue or flagged to the model.
        """
        key = (proc.pid, call_id)
        if key in self._open:
            self._end_early(
                key, Cancelled(f"BLS request to model '{self._open[key].name}' was cancelled")
            )
            return
        task = self._tasks.get(key)
        if task is None or task.done() or key in self._cancelled:
            return
        work = self._streaming.get(key)
        if work is not None and work.on_cancel is not None:  # running in an instance
            self._cancelled.add(key)  # once
            work.cancel()
            return
        self._cancelled.add(key)
        task.cancel()

    def done(self, proc: StubChannel, call_id: int) -> None:
        for completion in self._held.pop((proc.pid, call_id), []):
            completion.release()

    def forget_process(self, proc: StubChannel) -> None:
        for key in [k for k in self._open if k[0] == proc.pid]:
            open_call = self._open.pop(key)
            _abandon(open_call.work, [])
            open_call.caller.call_ended(proc)
        for key in [k for k in self._held if k[0] == proc.pid]:
            self.done(proc, key[1])

    # -- a call with one response: callbacks, no task ---------------------------------------

    def _start(
        self, caller: Caller, proc: StubChannel, call: msg.BlsCall, key: tuple[int, int]
    ) -> None:
        """Submit the call's request now, from the message's own callback; the reply is sent
        from its future's done-callback. A cancel answers at once. The request's ``timeout``
        is Triton's: a queue timeout, which the target's scheduler enforces (UNAVAILABLE
        "Request timeout expired"); a call that started in time runs to its end."""
        try:
            target = self._target(caller, call)
            spilled = self._spill(target, call)
        except ShoalError as error:
            self._send(proc, _error_reply(call.call_id, error))
            return
        except Exception as error:  # a bug must answer the caller, not leave it waiting
            log.exception("BLS call from '%s' failed", caller.name)
            internal = ShoalError(f"internal error in BLS: {error!r}")
            self._send(proc, _error_reply(call.call_id, internal))
            return
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        batch = staging.batch_of(
            target.summary.max_batch_size, [t.shape for t in call.request.inputs]
        )
        work = Work(call.request, spilled, future, batch_size=batch)
        if call.request.trace_context and self._tracing is not None:  # stamped before the reply
            traced.bls_call(self._tracing, target, work, self._directory.view)
        open_call = _OpenCall(call.model_name, work, target, proc, caller)
        self._open[key] = open_call
        caller.call_began(proc)  # before the request can be handed to an instance
        future.add_done_callback(functools.partial(self._answered, key, open_call))
        target.submit(work)

    def _answered(
        self, key: tuple[int, int], open_call: _OpenCall, future: asyncio.Future[Completion]
    ) -> None:
        if self._open.get(key) is not open_call:  # answered already: _end_early released it
            return
        del self._open[key]
        try:
            self._send_answer(key, open_call, future)
        finally:
            open_call.caller.call_ended(open_call.proc)

    def _send_answer(
        self, key: tuple[int, int], open_call: _OpenCall, future: asyncio.Future[Completion]
    ) -> None:
        proc, work, target = open_call.proc, open_call.work, open_call.target
        error = _failure(open_call, future)
        if error is not None:
            self._send(proc, _error_reply(key[1], error))
            return
        completion = future.result()
        _count(target, work, completion)
        self._held.setdefault(key, []).append(completion)
        try:
            proc.forward([o.location for o in completion.response.outputs], self._directory)
        except ShoalError as forward_error:  # the target's arena is gone (its stub died)
            self._send(proc, _error_reply(key[1], forward_error))
            return
        except OSError:
            return  # the caller is gone: forget_process releases what it held
        self._send(proc, msg.BlsReply(key[1], completion.response, True))

    def _end_early(self, key: tuple[int, int], error: ShoalError) -> None:
        """Answer a call with ``error`` now and drop its request (a cancel)."""
        open_call = self._open.pop(key, None)
        if open_call is None:
            return
        _abandon(open_call.work, [])
        self._send(open_call.proc, _error_reply(key[1], error))
        open_call.caller.call_ended(open_call.proc)

    def _send(self, proc: StubChannel, reply: msg.BlsReply) -> None:
        try:
            if proc.send(reply):
                return
        except PeerGone:
            return  # the caller is gone
        self._send_when_room(proc, reply)

    def _send_when_room(self, proc: StubChannel, reply: msg.BlsReply) -> None:
        task = asyncio.ensure_future(self._send_later(proc, reply))  # a full ring: wait
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    @staticmethod
    async def _send_later(proc: StubChannel, reply: msg.BlsReply) -> None:
        try:
            await proc.send_async(reply)
        except PeerGone:
            pass

    # -- a decoupled call: a task that forwards each response -------------------------------

    async def _serve(self, caller: Caller, proc: StubChannel, call: msg.BlsCall) -> None:
        try:
            target = self._target(caller, call)
            await self._run(target, proc, call)  # the scheduler enforces the queue timeout
        except asyncio.CancelledError:
            if (proc.pid, call.call_id) not in self._cancelled:
                raise  # shutdown, not a BLS cancel
            current = asyncio.current_task()
            if current is not None and sys.version_info >= (3, 11):  # 3.10 keeps no count
                current.uncancel()
            await self._reply_error(
                proc, call, Cancelled(f"BLS request to model '{call.model_name}' was cancelled")
            )
        except ShoalError as error:
            await self._reply_error(proc, call, error)
        except Exception as error:  # a bug must answer the caller, not leave it waiting
            log.exception("BLS call from '%s' failed", caller.name)
            await self._reply_error(proc, call, ShoalError(f"internal error in BLS: {error!r}"))

    def _target(self, caller: Caller, call: msg.BlsCall) -> ModelVersion:
        version = "" if call.model_version < 0 else str(call.model_version)
        target = self._models.resolve(call.model_name, version)
        _check_callable(target, call)
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
        call.request.requested_outputs = staging.check_outputs(target.summary, request)
        staging.check_inputs(target.summary, request)
        return target

    def _spill(self, target: ModelVersion, call: msg.BlsCall) -> list[Block]:
        """The call's inline inputs in input-arena blocks when they pass what ``target``'s
        requests may carry inline (the work owns the blocks)."""
        inputs = call.request.inputs
        if staging.inline_bytes(inputs) <= target.summary.inline_budget:
            return []
        return staging.spill_inline(inputs, self._directory.input_arena)

    async def _run(self, target: ModelVersion, proc: StubChannel, call: msg.BlsCall) -> None:
        work = self._submit(target, proc, call)
        held = self._held.setdefault((proc.pid, call.call_id), [])
        try:
            if work.stream is None:
                await self._answer(target, proc, call.call_id, work, held)
            else:
                await self._stream(proc, call.call_id, work.stream, held)
        except BaseException:
            _abandon(work, held)
            raise

    def _submit(self, target: ModelVersion, proc: StubChannel, call: msg.BlsCall) -> Work:
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        work = Work(
            call.request,
            self._spill(target, call),
            future,
            batch_size=staging.batch_of(
                target.summary.max_batch_size, [t.shape for t in call.request.inputs]
            ),
        )
        if target.config.decoupled:
            work.stream = new_stream()
            self._streaming[(proc.pid, call.call_id)] = work
        if call.request.trace_context and self._tracing is not None:
            traced.bls_call(self._tracing, target, work, self._directory.view)
        target.submit(work)
        return work

    async def _answer(
        self,
        target: ModelVersion,
        proc: StubChannel,
        call_id: int,
        work: Work,
        held: list[Completion],
    ) -> None:
        """A call to a non-decoupled model: its one response, counted in its statistics."""
        completion = await work.awaited()
        held.append(completion)
        _count(target, work, completion)
        await self._reply(proc, call_id, completion.response, True)

    async def _stream(
        self,
        proc: StubChannel,
        call_id: int,
        stream: asyncio.Queue[Completion | BaseException | None],
        held: list[Completion],
    ) -> None:
        """A call to a decoupled model: each response as it comes."""
        while (item := await stream.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            held.append(item)
            # The response that carries FINAL is the iterator's last (Triton yields no
            # extra empty one); a flags-only FINAL comes as an empty response.
            await self._reply(proc, call_id, item.response, item.final)
            if item.final:
                return
        await self._reply(proc, call_id, None, True)

    async def _reply(
        self, proc: StubChannel, call_id: int, body: msg.ResponseRecord | None, final: bool
    ) -> None:
        if body is not None:
            proc.forward([o.location for o in body.outputs], self._directory)
        await proc.send_async(msg.BlsReply(call_id, body, final))

    async def _reply_error(self, proc: StubChannel, call: msg.BlsCall, error: ShoalError) -> None:
        body = msg.ResponseRecord(error=(error.code.name, error.message))
        try:
            await proc.send_async(msg.BlsReply(call.call_id, body, True))
        except Exception:
            pass  # the caller is gone


@dataclass(eq=False)
class _OpenCall:
    """A call with one response, submitted and not answered yet."""

    name: str  # the called model, as the caller named it
    work: Work
    target: ModelVersion
    proc: StubChannel
    caller: Caller


def _error_reply(call_id: int, error: ShoalError) -> msg.BlsReply:
    return msg.BlsReply(call_id, msg.ResponseRecord(error=(error.code.name, error.message)), True)


def _check_callable(target: ModelVersion, call: msg.BlsCall) -> None:
    """A BLS call reaches a model, not an ensemble; a decoupled model only by a decoupled call."""
    if target.config.is_ensemble:
        raise Unsupported(
            f"BLS calls to ensemble '{target.name}' are not supported yet; call its steps"
        )
    if target.config.decoupled and not call.decoupled:
        # A decoupled call takes any model (its one response comes with FINAL), as in
        # Triton; a decoupled model's responses need an iterator.
        raise Unsupported(  # Triton's words
            f"Model {target.name} is using the decoupled. The current BLS request call "
            "doesn't support models using the decoupled transaction policy. Please use "
            "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
            "models.'"
        )


def _count(target: ModelVersion, work: Work, completion: Completion) -> None:
    """The call in its target's statistics."""
    elapsed = time.monotonic_ns() - work.enqueued_ns
    if completion.response.error is None:
        target.stats.success(work.batch_size, elapsed, completion.queue_ns, completion.compute_ns)
        target.stats.first_response(elapsed)
    else:
        target.stats.failure(elapsed, ModelError.reason)


def _failure(open_call: _OpenCall, future: asyncio.Future[Completion]) -> ShoalError | None:
    """Why a call with one response failed (None: it has its response)."""
    if future.cancelled():  # not by the router: it answers its own cancels first
        return Cancelled(f"BLS request to model '{open_call.name}' was cancelled")
    error = future.exception()
    if error is None or isinstance(error, ShoalError):
        return error
    return ShoalError(f"internal error in BLS: {error!r}")


def _release_unread(stream: asyncio.Queue[Completion | BaseException | None]) -> None:
    while not stream.empty():
        item = stream.get_nowait()
        if isinstance(item, Completion):
            item.release()


def _release_late_response(future: asyncio.Future[Completion], held: list[Completion]) -> None:
    arrived = future.done() and not future.cancelled() and future.exception() is None
    if arrived and future.result() not in held:  # it came as the call was being cancelled
        future.result().release()


def _abandon(work: Work, held: list[Completion]) -> None:
    """The caller no longer waits: cancel the target's request (dropped if still queued, flagged
    to the model if running) and give back the responses nobody will read."""
    _release_late_response(work.awaited(), held)
    work.closed = True
    work.cancel()
    if work.stream is not None:
        _release_unread(work.stream)
