"""Run one batch through the model's ``execute`` and turn its return value into messages.

Non-decoupled models answer with one :class:`~shoal.ipc.model_messages.Result` per batch. Decoupled
models send each response as it is made (:class:`~shoal.ipc.model_messages.Response`), from any
thread, and the batch's Result only says that ``execute`` returned.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from time import monotonic_ns, perf_counter_ns
from typing import Any, Final

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.model_messages import Execute, Response, Result
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.ipc.tensor import (
    CudaLocation,
    CudaRegionLocation,
    InlineBytes,
    Location,
    TensorDesc,
    buffer_to_numpy,
)
from shoal.stub import pb_utils
from shoal.stub._pb_request import InferenceRequest
from shoal.stub._pb_tensor import Tensor
from shoal.stub.bls import calling_requests
from shoal.stub.execute_checks import (
    RESCHEDULE,
    RESCHEDULED_MARK,
    ExecuteError,
    check_return,
    failure_text,
    model_parameters,
    rescheduled_positions,
    settle_all,
)
from shoal.stub.inline_inputs import inline_array
from shoal.stub.model_loop import ModelLoop
from shoal.stub.open_requests import CALLING, CancelFlag, OpenRequests, batch_callers
from shoal.stub.response_records import ResponseRecorder
from shoal.stub.tensors_out import TensorWriter

FINAL = 1
#: Input locations in device memory: a CUDA pool block or a client's CUDA region.
_ON_A_GPU = (CudaLocation, CudaRegionLocation)
log = logging.getLogger("shoal.stub")


# Bound once: compiled, ``Tensor._wrap(...)`` makes a bound method per call.
_wrap_tensor: Final = Tensor._wrap
_received_request: Final = InferenceRequest._from_server
_get_ident: Final = threading.get_ident


class _Batch:
    """A batch in ``execute`` (not a dataclass: mypyc leaves its ``__init__`` interpreted)."""

    def __init__(
        self, execute: Execute, requests: list[Any], sent: list[list[Any]], t0: int, t1: int
    ) -> None:
        self.execute = execute
        self.requests = requests
        self.sent = sent
        self.t0 = t0
        self.t1 = t1


class BatchExecutor:
    """Builds pb_utils requests over shared memory, calls execute, writes outputs once."""

    def __init__(
        self,
        instance: str,
        model: Any,
        writer: TensorWriter,
        input_view: Callable[[Location], memoryview],
        send: Callable[[msg.Message], None],
        decoupled: bool,
        private_view: Callable[[Location, memoryview], memoryview],
        *,
        concurrent_async: bool = False,
    ) -> None:
        self.instance = instance
        self.model = model
        self.writer = writer
        self.input_view = input_view
        #: A writable view of an input that others may read too (its writes stay here).
        self.private_view = private_view
        self.send = send
        self.decoupled = decoupled
        #: ``async def execute`` of a model that asked for it (``async_execute_concurrency`` > 1):
        #: batches run concurrently on the model's event loop. Otherwise each coroutine runs to
        #: completion before the next batch, as in Triton.
        self.concurrent = concurrent_async and inspect.iscoroutinefunction(
            getattr(model, "execute", None)
        )
        self._model_loop = ModelLoop()
        self._recorder = ResponseRecorder(instance, writer)
        self._open = OpenRequests()
        # Default-mode requests whose execute returned without their response, which the
        # model sends later through the request's sender: key -> called when it arrives.
        self._late: dict[int, Callable[[], None]] = {}
        self._late_lock = threading.Lock()

    # -- the batch --------------------------------------------------------------------------

    def run(self, execute: Execute) -> Result | None:
        """The batch's Result, or None when an ``async def execute`` runs on concurrently (its
        Result is sent when the coroutine finishes)."""
        started = monotonic_ns()
        result = self._run(execute)
        if result is not None:
            result.stub_ns = (started, monotonic_ns())
        return result

    def cancel(self, keys: list[int]) -> None:
        """The supervisor says these requests' clients went away (any thread)."""
        self._open.cancel(keys)

    def await_result(self, awaitable: Any) -> Any:
        """Run a coroutine of the model to completion on the model's event loop."""
        return self._model_loop.await_result(awaitable)

    def _run(self, execute: Execute) -> Result | None:
        t0 = perf_counter_ns()
        records = execute.requests
        # What each request's response sender delivered (Triton's default-mode sender: one
        # response and FINAL, with execute returning None for that request).
        sent: list[list[Any]] = [[] for _ in records]
        flags = [CancelFlag() for _ in records]  # native: a fraction of an interpreted one
        try:
            requests = [self._request(records[i], sent[i], flags[i]) for i in range(len(records))]
        except Exception as error:  # a tensor the stub cannot view must not kill the instance
            return self._unreadable(execute, error)
        if self._open.track(records, flags) == len(requests):
            return self._dropped(execute)
        t1 = perf_counter_ns()
        # BLS calls made while serving these requests are cancelled along with them: the batch
        # goes in CALLING for this thread (a few stores), and in the context as well once the
        # model has built a BLS request (a ContextVar set and reset, ~2k instructions).
        calling = CALLING
        if calling.exact:
            token = calling_requests.set(batch_callers(records, flags))
            try:
                return self._execute(execute, requests, sent, t0, t1)
            finally:
                calling_requests.reset(token)
        # Saved and restored: a BLS call may serve another batch on this thread meanwhile.
        saved_records, saved_flags, saved_thread = calling.records, calling.flags, calling.thread
        calling.records, calling.flags, calling.thread = records, flags, _get_ident()
        try:
            return self._execute(execute, requests, sent, t0, t1)
        finally:
            calling.records, calling.flags, calling.thread = (
                saved_records,
                saved_flags,
                saved_thread,
            )

    def _unreadable(self, execute: Execute, error: Exception) -> Result:
        """The batch's requests fail: the stub cannot read their inputs."""
        text = self.failure(f"cannot read the request's inputs: {type(error).__name__}: {error}")
        failure = ResponseRecord(error=("INVALID_ARG", text))
        if self.decoupled:  # decoupled requests are answered on their streams
            self._send_finals(execute.requests, failure)
            return Result(execute.batch_id, [], (0, 0, 0))
        return Result(execute.batch_id, [failure] * len(execute.requests), (0, 0, 0))

    def _execute(
        self, execute: Execute, requests: list[Any], sent: list[list[Any]], t0: int, t1: int
    ) -> Result | None:
        if self.decoupled:
            rescheduled = self._run_decoupled(requests, execute.requests)
            timings = (t1 - t0, perf_counter_ns() - t1, 0)
            return Result(execute.batch_id, [], timings, rescheduled)
        batch = _Batch(execute, requests, sent, t0, t1)
        try:
            result = self.model.execute(requests)
            if type(result) is not list and inspect.isawaitable(result):
                future = self._model_loop.submit(result)
                if self.concurrent:
                    future.add_done_callback(lambda done: self._send_finished(batch, done))
                    return None
                result = future.result()
        except Exception as error:  # the model's failure fails its requests, not the stub
            return self._failed(batch, self._model_error(error))
        return self._finish(batch, result)

    def _dropped(self, execute: Execute) -> Result:
        """A batch cancelled while it waited in the ring is not executed, as Triton drops
        cancelled requests from its queues."""
        self._open.untrack_records(execute.requests)
        cancelled = ResponseRecord(error=("CANCELLED", "the request was cancelled"))
        if self.decoupled:
            self._send_finals(execute.requests, cancelled)
            return Result(execute.batch_id, [], (0, 0, 0), executed=False)
        responses = [cancelled] * len(execute.requests)
        return Result(execute.batch_id, responses, (0, 0, 0), executed=False)

    def _send_finals(self, records: list[RequestRecord], answer: ResponseRecord) -> None:
        for record in records:
            self.send(Response(record.key, answer, True))

    def _send_finished(self, batch: _Batch, done: concurrent.futures.Future[Any]) -> None:
        error = done.exception()
        if error is not None:
            result: Result | None = self._failed(batch, self._model_error(error))
        else:
            result = self._finish(batch, done.result())
        if result is not None:
            self._send_result(result)

    def _send_result(self, result: Result) -> None:
        try:
            self.send(result)
        except Exception:
            log.exception("could not send the result of an execute")

    def _failed(self, batch: _Batch, text: str) -> Result:
        self._open.untrack_records(batch.execute.requests)
        for request in batch.requests:
            request.get_response_sender()._close()
        failure = ResponseRecord(error=("INTERNAL", text))
        t2 = perf_counter_ns()
        records = self._records_despite(batch, failure)
        timings = (batch.t1 - batch.t0, t2 - batch.t1, 0)
        return Result(batch.execute.batch_id, records, timings)

    def _finish(self, batch: _Batch, result: Any) -> Result | None:
        """The batch's Result; None when responses are still to come through senders (the
        Result goes up once the last of them arrives)."""
        try:
            # A copy: the model may keep the list it returned.
            responses = list(check_return(self.instance, result, len(batch.requests)))
            rescheduled = rescheduled_positions(self.instance, batch.requests, responses)
        except ExecuteError as error:
            return self._failed(batch, str(error))
        self._open.untrack_records(batch.execute.requests)
        if rescheduled:
            for i in rescheduled:
                responses[i] = RESCHEDULED_MARK
        waiting = settle_all(self.instance, batch.requests, batch.sent, responses)
        if waiting and not self._wait_for_senders(batch, responses, rescheduled, waiting):
            return None
        return self._result(batch, responses, rescheduled)

    def _wait_for_senders(
        self, batch: _Batch, responses: list[Any], rescheduled: list[int], waiting: list[int]
    ) -> bool:
        """Triton's default-mode sender may answer after execute returned (from a thread): the
        batch's Result waits for those responses. True if they are all here already."""
        remaining: set[int] = set()

        def arrived(position: int) -> None:
            with self._late_lock:
                responses[position] = batch.sent[position][0]
                remaining.discard(position)
                done = not remaining
            if done:
                self._send_result(self._result(batch, responses, rescheduled))

        with self._late_lock:
            for i in waiting:
                if batch.sent[i]:
                    responses[i] = batch.sent[i][0]
                else:
                    remaining.add(i)
                    self._late[batch.execute.requests[i].key] = functools.partial(arrived, i)
            return not remaining  # decided under the lock: else arrived() sends the Result

    def _result(self, batch: _Batch, responses: list[Any], rescheduled: list[int]) -> Result:
        t2 = perf_counter_ns()
        recorder = self._recorder
        requests = batch.execute.requests
        records = [
            ResponseRecord() if r is RESCHEDULED_MARK else recorder.record(r, requests[i])
            for i, r in enumerate(responses)
        ]
        t3 = perf_counter_ns()
        timings = (batch.t1 - batch.t0, t2 - batch.t1, t3 - t2)
        return Result(batch.execute.batch_id, records, timings, rescheduled)

    # -- requests ---------------------------------------------------------------------------

    def _request(self, record: RequestRecord, delivered: list[Any], flag: CancelFlag) -> Any:
        if self.decoupled:
            deliver = self._stream_to(record)
        else:
            deliver = self._collect_to(delivered, record.key)
        # By position: a keyword call of interpreted code from compiled code costs ~1k more.
        # (model_name "", model_version -1: the served model's.)
        return _received_request(
            record.request_id,
            record.correlation_id,
            self._inputs(record),
            record.requested_outputs,
            record.flags,
            model_parameters(record.parameters),
            record.timeout_us,
            "",
            -1,
            deliver,
            self.decoupled,
            record.trace_context or None,
            flag,
        )

    def _inputs(self, record: RequestRecord) -> list[Any]:
        tensors = []
        for i, desc in enumerate(record.inputs):
            if type(desc.location) in _ON_A_GPU:
                assert self.writer.gpu is not None
                tensors.append(self.writer.gpu.input_tensor(desc))
                continue
            tensors.append(self._cpu_input(desc, bool(record.private_inputs >> i & 1)))
        return tensors

    def _collect_to(self, delivered: list[Any], key: int) -> Callable[[Any, int], None]:
        """A default-mode request's sender: its response goes with the batch's Result (or, when
        execute returned before it came, wakes the Result that waits for it)."""

        def deliver(response: Any, flags: int) -> None:
            if response is None:
                return
            with self._late_lock:
                delivered.append(response)
                late = self._late.pop(key, None)
            if late is not None:
                late()

        return deliver

    def _cpu_input(self, desc: TensorDesc, private: bool) -> Any:
        """An input the model owns, as on Triton: it may write the array ``as_numpy()`` gives.

        A block staged for this request alone is the array itself (no copy either way), and
        can be handed back by descriptor as an output, written or not. Anything others may
        read too (client regions, ensemble and BLS tensors) is seen through a private view.
        """
        location = desc.location
        if type(location) is InlineBytes and desc.datatype != "BYTES":
            # Carried in the Execute (a small tensor): the model's own copy, as the runtime's
            # input_view and private_view make it, without those two calls of interpreted code.
            array = inline_array(desc.datatype, desc.shape, location.data)
            return _wrap_tensor(desc.name, array, desc.datatype)
        view = self.input_view(location)
        if desc.datatype == "BYTES":  # decoded into objects: already the model's own
            array = buffer_to_numpy(desc.datatype, desc.shape, view)
        elif private and type(desc.location) is Block:
            array = buffer_to_numpy(desc.datatype, desc.shape, view, readonly=False)
            self.writer.locations.remember(array, desc, returnable=True)
        else:
            # Not remembered: its bytes may differ from the block's once the model wrote it.
            writable = self.private_view(desc.location, view)
            array = buffer_to_numpy(desc.datatype, desc.shape, writable, readonly=False)
        return _wrap_tensor(desc.name, array, desc.datatype)

    def _stream_to(self, record: RequestRecord) -> Callable[[Any, int], None]:
        def deliver(response: Any, flags: int) -> None:
            body = None if response is None else self._recorder.record(response, record)
            final = bool(flags & FINAL)
            if final:
                self._open.untrack([record.key])
            self.send(Response(record.key, body, final))

        return deliver

    def _records_despite(self, batch: _Batch, failure: ResponseRecord) -> list[Any]:
        """A request whose response was sent before the failure keeps it; the others fail."""
        return [
            self._recorder.record(delivered[0], record) if delivered else failure
            for delivered, record in zip(batch.sent, batch.execute.requests, strict=True)
        ]

    # -- execute ----------------------------------------------------------------------------

    def _run_decoupled(self, requests: list[Any], records: list[RequestRecord]) -> list[int]:
        """Run a decoupled execute; returns the positions of the requests it rescheduled."""
        try:
            if not self._call_decoupled(requests, records):
                return []
        except Exception as error:
            text = str(error) if isinstance(error, ExecuteError) else self._model_error(error)
            self._fail_open(requests, records, text)
            return []  # after an error every request is released with RELEASE_ALL, as in Triton
        return self._rescheduled(requests, records)

    def _rescheduled(self, requests: list[Any], records: list[RequestRecord]) -> list[int]:
        # Triton reads the release flags once execute returned: the request runs again.
        rescheduled = [i for i, r in enumerate(requests) if r._release_flags() == RESCHEDULE]
        self._open.untrack([records[i].key for i in rescheduled])
        return rescheduled

    def _call_decoupled(self, requests: list[Any], records: list[RequestRecord]) -> bool:
        """Call a decoupled execute: True when it returned, False when it is a coroutine that
        runs on in the background (Triton: execute is done)."""
        result = self.model.execute(requests)
        if type(result) is not list and inspect.isawaitable(result):
            future = self._model_loop.submit(result)
            future.add_done_callback(lambda f: self._after_async(f, requests, records))
            return False
        if result is not None:
            raise ExecuteError(
                self.failure(
                    f"Python model '{self.instance}' is using the decoupled mode and the "
                    "execute function must return None."
                )
            )
        return True

    def _after_async(
        self,
        future: concurrent.futures.Future[Any],
        requests: list[Any],
        records: list[RequestRecord],
    ) -> None:
        error = future.exception()
        if error is not None:
            self._fail_open(requests, records, self._model_error(error))

    def _fail_open(self, requests: list[Any], records: list[RequestRecord], text: str) -> None:
        """Send an error as the final response of every request whose sender is still open;
        an error no client can receive any more (every sender sent FINAL) goes to the log."""
        failed = [self._fail_if_open(q, r, text) for q, r in zip(requests, records, strict=True)]
        if not any(failed):
            pb_utils.Logger.log_error(text)

    def _fail_if_open(self, request: Any, record: RequestRecord, text: str) -> bool:
        sender = request.get_response_sender()
        if sender._is_closed():
            return False
        sender._close()
        self._open.untrack([record.key])
        self.send(Response(record.key, ResponseRecord(error=("INTERNAL", text)), True))
        return True

    def failure(self, text: str) -> str:
        return failure_text(self.instance, text)

    def _model_error(self, error: BaseException) -> str:
        """What the model raised, as the error text of its requests."""
        return self.failure(f"{type(error).__name__}: {error}")
