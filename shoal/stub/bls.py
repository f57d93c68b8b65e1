"""BLS from inside a model: ``InferenceRequest(...).exec()`` / ``async_exec()``.

Inputs go to the supervisor by descriptor (an input of the current request or an output of an
earlier BLS call is not copied); the called model's outputs come back as read-only zero-copy
views of its output arena. Those blocks stay reserved until every array over them is gone: a
keeper object referenced by the arrays tells the supervisor (``BlsDone``) when that happens.

A call belongs to the requests whose ``execute`` made it (:func:`current_callers`: the batch
running on this thread, or :data:`calling_requests`, a context variable, so it follows
``async_exec`` and the coroutines of an ``async def execute``). When the
clients of all of them have gone away, the call is cancelled too (``BlsCancel``), as is a decoupled
call whose ``ResponseIterator.cancel()`` the model calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import (
    INLINE_REQUEST_MAX,
    CudaLocation,
    InlineBytes,
    TensorDesc,
    buffer_to_numpy,
)
from shoal.stub import pb_utils
from shoal.stub._pb_memory import place_outputs
from shoal.stub.memory import kept_view
from shoal.stub.open_requests import CALLING
from shoal.stub.pump import DownPump
from shoal.stub.tensors_out import TensorWriter, Written

#: The requests whose ``execute`` runs in this context, as ``(key, cancellation flag)`` pairs
#: (set by the executor; a flag's ``cancelled`` turns true when the client goes away). Not the
#: requests themselves: a task the model starts copies the context, and must not keep the
#: requests' input views alive.
calling_requests: contextvars.ContextVar[tuple[tuple[int, Any], ...]] = contextvars.ContextVar(
    "calling_requests", default=()
)


def current_callers() -> tuple[tuple[int, Any], ...]:
    """The ``(key, flag)`` pairs of the requests a BLS call made here serves: the context's
    (an ``async def execute``, a task or thread that copied the context of an execute, once the
    executor sets it: ``open_requests.CallingRequests``), else the plain execute running on this
    thread."""
    callers = calling_requests.get()
    if callers:
        return callers
    return CALLING.callers_here(threading.get_ident())


class _CallKeeper:
    """Alive while any output array of one BLS call is; its death frees the call's memory."""

    def __init__(self, release: Callable[[], None]) -> None:
        weakref.finalize(self, release)


class BlsClient:
    """The executor behind ``pb_utils.InferenceRequest.exec`` in a stub."""

    def __init__(
        self,
        writer: TensorWriter,
        pump: DownPump,
        send: Callable[[msg.Message], None],
        input_view: Callable[[Block], memoryview],
    ) -> None:
        self._writer = writer
        self._pump = pump
        self._send = send
        self._input_view = input_view
        self._lock = threading.Lock()
        #: Open calls made on behalf of requests: call id -> keys not cancelled yet.
        self._waiting_on: dict[int, set[int]] = {}
        self._cancelled: set[int] = set()
        #: While the main thread runs a sync execute, the BlsDone of calls whose outputs it
        #: drops wait here, and go up just before its next BlsCall or its Result.
        self._deferring = False
        self._main = threading.get_ident()
        self._done_ids: list[int] = []

    # -- giving back the outputs of calls ---------------------------------------------------

    def begin_batch(self) -> None:
        """Before a sync execute on the main thread: the BlsDone messages of calls dropped
        during it are sent together, right before the model's next BLS call or at
        :meth:`end_batch`. The supervisor then wakes once and releases the called models'
        blocks in one message, instead of once per call, and memory comes back no later than
        at the next call. (Two calls rather than a context manager: this runs per batch.)"""
        self._main = threading.get_ident()
        self._deferring = True

    def end_batch(self) -> None:
        self._deferring = False
        self._flush_done()

    @contextlib.contextmanager
    def batching_done(self) -> Iterator[None]:
        """:meth:`begin_batch` and :meth:`end_batch` around a block."""
        self.begin_batch()
        try:
            yield
        finally:
            self.end_batch()

    def _call_done(self, call_id: int) -> None:
        if self._deferring and threading.get_ident() == self._main:
            self._done_ids.append(call_id)
            return
        self._send_done(call_id)

    def _flush_done(self) -> None:
        # Only the main thread appends to or flushes the list; a finalizer that runs inside
        # this loop (a garbage collection) appends behind it and is sent too.
        while self._done_ids:
            self._send_done(self._done_ids.pop(0))

    def _send_done(self, call_id: int) -> None:
        try:
            self._send(msg.BlsDone(call_id))
        except Exception:
            pass  # the supervisor is gone; so is the memory

    # -- cancellation -----------------------------------------------------------------------

    def cancel_requests(self, keys: list[int]) -> None:
        """These requests were cancelled: cancel the calls made only on their behalf."""
        for call_id in self._orphaned_by(set(keys)):
            self.cancel_call(call_id)

    def _orphaned_by(self, gone: set[int]) -> list[int]:
        """The calls whose every requester is in ``gone`` (taken off their lists)."""
        doomed = []
        with self._lock:
            for call_id, parents in self._waiting_on.items():
                if parents & gone:
                    parents -= gone
                    if not parents:
                        doomed.append(call_id)
        return doomed

    def cancel_call(self, call_id: int) -> None:
        """Ask the supervisor to cancel an open call (once; a finished call is left alone)."""
        with self._lock:
            if call_id not in self._waiting_on or call_id in self._cancelled:
                return
            self._cancelled.add(call_id)
        try:
            self._send(msg.BlsCancel(call_id))
        except Exception:
            pass  # the supervisor is gone: the call ends with the stub

    def _opened(self, call_id: int) -> bool:
        """Track a call; True when every request it serves is cancelled already."""
        parents = current_callers()
        with self._lock:
            self._waiting_on[call_id] = {key for key, flag in parents if not flag.cancelled}
        return bool(parents) and not self._waiting_on[call_id]

    def _closed(self, call_id: int) -> None:
        self._pump.forget(call_id)
        with self._lock:
            self._waiting_on.pop(call_id, None)
            self._cancelled.discard(call_id)

    # -- calls ------------------------------------------------------------------------------

    def exec(self, request: Any, decoupled: bool) -> Any:
        call_id, keeper = self._call(request, decoupled)
        if decoupled:
            iterator = pb_utils.ResponseIterator(cancel=lambda: self.cancel_call(call_id))
            threading.Thread(
                target=self._stream,
                args=(call_id, iterator, keeper),
                daemon=True,
                name=f"bls-stream-{call_id}",
            ).start()
            iterator._wait_first()
            return iterator
        try:
            reply = self._pump.next_reply(call_id)
        finally:
            self._closed(call_id)
        assert isinstance(reply, msg.BlsReply)
        return place_outputs(self._response(reply.response, keeper), request._preferred_memory())

    def async_exec(self, request: Any, decoupled: bool) -> Awaitable[Any]:
        loop = asyncio.get_running_loop()
        # The worker thread runs in this context, so the call knows the requests it serves
        # (those of the execute running on this thread go into it: the worker is not that one).
        context = contextvars.copy_context()
        parents = current_callers()
        if parents:
            context.run(calling_requests.set, parents)
        return loop.run_in_executor(None, context.run, self.exec, request, decoupled)

    def _call(self, request: Any, decoupled: bool) -> tuple[int, _CallKeeper]:
        call_id = self._pump.new_call_id()
        written: Written = []
        inputs = self._write_inputs(request, written)
        # The input tensors live until the call's response is dropped: one passed on by
        # descriptor (an earlier call's output, say) must not be freed while this call runs.
        kept = list(request.inputs())

        def release() -> None:
            kept.clear()
            self._writer.free(written)
            self._call_done(call_id)

        keeper = _CallKeeper(release)
        record = _record(request, inputs)
        self._pump.expect(call_id)
        orphan = self._opened(call_id)
        if self._done_ids and threading.get_ident() == self._main:
            self._flush_done()
        model, version = request._model_name(), int(request._model_version())
        self._send(msg.BlsCall(call_id, model, version, record, decoupled))
        if orphan:  # made for requests whose clients have gone already
            self.cancel_call(call_id)
        return call_id, keeper

    def _write_inputs(self, request: Any, written: Written) -> list[TensorDesc]:
        """The call's inputs: small ones inline in the BlsCall (up to a request's inline
        budget; the supervisor moves them to blocks where the called model may carry less),
        the others written into this stub's output arena or passed on by descriptor."""
        descs: list[TensorDesc] = []
        room = INLINE_REQUEST_MAX
        try:
            for tensor in request.inputs():
                desc = self._writer.describe(tensor, written, for_response=False, inline_room=room)
                if type(desc.location) is InlineBytes:
                    room -= desc.location.nbytes
                descs.append(desc)
            return descs
        except BaseException:
            self._writer.free(written)  # the inputs written before the one that failed
            raise

    def _stream(self, call_id: int, iterator: Any, keeper: _CallKeeper) -> None:
        try:
            while True:
                reply = self._pump.next_reply(call_id)
                assert isinstance(reply, msg.BlsReply)
                response = (
                    None if reply.response is None else self._response(reply.response, keeper)
                )
                iterator._push(response, reply.final)
                if reply.final:
                    return
        except Exception as error:  # the stub is going down: end the iteration with an error
            failure = pb_utils.TritonError(f"BLS stream ended: {error}")
            iterator._push(pb_utils.InferenceResponse(error=failure), True)
        finally:
            self._closed(call_id)

    def _response(self, record: msg.ResponseRecord | None, keeper: _CallKeeper) -> Any:
        if record is None:
            return pb_utils.InferenceResponse()
        if record.error is not None:
            code_name, message = record.error
            code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
        tensors = [self._tensor(desc, keeper) for desc in record.outputs]
        return pb_utils.InferenceResponse._from_parts(tensors, None, dict(record.parameters))

    def _tensor(self, desc: TensorDesc, keeper: _CallKeeper) -> Any:
        if type(desc.location) is CudaLocation:
            assert self._writer.gpu is not None
            return self._writer.gpu.output_tensor(desc, keeper)
        return self._host_tensor(desc, keeper)

    def _host_tensor(self, desc: TensorDesc, keeper: _CallKeeper) -> Any:
        """An output in shared memory, read in place for as long as ``keeper`` lives (or one
        whose bytes the reply carried: the model's own, read-only as the others)."""
        if isinstance(desc.location, InlineBytes):
            array = buffer_to_numpy(desc.datatype, desc.shape, desc.location.data)
            return pb_utils.Tensor._wrap(desc.name, array, desc.datatype)
        assert isinstance(desc.location, Block)
        view = self._input_view(desc.location)
        array = kept_view(desc.datatype, desc.shape, view, keeper)
        if desc.datatype != "BYTES":
            self._writer.locations.remember(array, desc, returnable=False)
        return pb_utils.Tensor._wrap(desc.name, array, desc.datatype)


def _record(request: Any, inputs: list[TensorDesc]) -> msg.RequestRecord:
    """A BLS request as the record its target's stub receives."""
    return msg.RequestRecord(
        request_id=request.request_id(),
        correlation_id=request.correlation_id(),
        flags=request.flags(),
        parameters=request._parameters_dict(),
        requested_outputs=sorted(request.requested_output_names()),
        inputs=inputs,
        timeout_us=int(request.timeout()),
        trace_context=request.trace().get_context() or "",  # the caller's, passed on
    )
