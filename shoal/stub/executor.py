"""Run one batch through the model's ``execute`` and turn its return value into messages.

Non-decoupled models answer with one :class:`~shoal.ipc.messages.Result` per batch. Decoupled
models send each response as it is made (:class:`~shoal.ipc.messages.Response`), from any
thread, and the batch's Result only says that ``execute`` returned.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaExhausted, Block
from shoal.ipc.tensor import (
    CudaLocation,
    CudaRegionLocation,
    Location,
    RegionLocation,
    TensorDesc,
    buffer_to_numpy,
)
from shoal.stub import pb_utils
from shoal.stub.bls import calling_requests
from shoal.stub.gpu_tensors import CudaPoolRefused
from shoal.stub.memory import RegionShrunk, RegionTooSmall
from shoal.stub.tensors_out import TensorWriter, Written

FINAL = 1
RESCHEDULE = 2  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
#: Input locations in device memory: a CUDA pool block or a client's CUDA region.
_ON_A_GPU = (CudaLocation, CudaRegionLocation)
#: Request parameters that are request fields in Triton: the model does not see them.
_RESERVED = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
log = logging.getLogger("shoal.stub")


@dataclass(eq=False)
class _Batch:
    execute: msg.Execute
    requests: list[Any]
    sent: list[list[Any]]
    t0: int
    t1: int


class ExecuteError(Exception):
    """The model's execute raised or returned something Triton's contract forbids."""


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        # Cancellation flags of the requests in the stub, by key (not the requests: no
        # reference here may keep a request's input views alive).
        self._open: dict[int, Any] = {}
        self._open_lock = threading.Lock()
        # Keys are handed out in increasing order. A Cancel for a key above every key seen is
        # for a request sent ahead and not yet started: it is remembered until that request
        # starts (so the set only holds requests still in the ring).
        self._newest_key = 0
        self._cancelled_early: set[int] = set()
        # Default-mode requests whose execute returned without their response, which the
        # model sends later through the request's sender: key -> called when it arrives.
        self._late: dict[int, Callable[[], None]] = {}
        self._late_lock = threading.Lock()

    def cancel(self, keys: list[int]) -> None:
        """The supervisor says these requests' clients went away (any thread)."""
        with self._open_lock:
            flags = [self._open.get(key) for key in keys]
            self._cancelled_early.update(
                key
                for key, flag in zip(keys, flags, strict=True)
                if flag is None and key > self._newest_key
            )
        for flag in flags:
            if flag is not None:
                flag.cancelled = True

    def _track(self, records: list[msg.RequestRecord], requests: list[Any]) -> None:
        with self._open_lock:
            for record, request in zip(records, requests, strict=True):
                key = record.key
                self._open[key] = request._cancellation
                if key > self._newest_key:
                    self._newest_key = key
                if self._cancelled_early and key in self._cancelled_early:
                    self._cancelled_early.discard(key)
                    request._cancellation.cancelled = True

    def _untrack(self, keys: list[int]) -> None:
        with self._open_lock:
            for key in keys:
                self._open.pop(key, None)

    # -- the batch --------------------------------------------------------------------------

    def run(self, execute: msg.Execute) -> msg.Result | None:
        """The batch's Result, or None when an ``async def execute`` runs on concurrently (its
        Result is sent when the coroutine finishes)."""
        started = time.monotonic_ns()
        result = self._run(execute)
        if result is not None:
            result.stub_ns = (started, time.monotonic_ns())
        return result

    def _run(self, execute: msg.Execute) -> msg.Result | None:
        t0 = time.perf_counter_ns()
        # What each request's response sender delivered (Triton's default-mode sender: one
        # response and FINAL, with execute returning None for that request).
        sent: list[list[Any]] = [[] for _ in execute.requests]
        try:
            requests = [self._request(r, sent[i]) for i, r in enumerate(execute.requests)]
        except Exception as error:  # a tensor the stub cannot view must not kill the instance
            text = self.failure(
                f"cannot read the request's inputs: {type(error).__name__}: {error}"
            )
            failure = msg.ResponseRecord(error=("INVALID_ARG", text))
            if self.decoupled:  # decoupled requests are answered on their streams
                for record in execute.requests:
                    self.send(msg.Response(record.key, failure, True))
                return msg.Result(execute.batch_id, [], (0, 0, 0))
            return msg.Result(execute.batch_id, [failure] * len(execute.requests), (0, 0, 0))
        self._track(execute.requests, requests)
        if all(request._cancellation.cancelled for request in requests):
            return self._dropped(execute)
        t1 = time.perf_counter_ns()
        # BLS calls made while serving these requests are cancelled along with them.
        token = calling_requests.set(
            tuple(
                (record.key, request._cancellation)
                for request, record in zip(requests, execute.requests, strict=True)
            )
        )
        try:
            return self._execute(execute, requests, sent, t0, t1)
        finally:
            calling_requests.reset(token)

    def _execute(
        self, execute: msg.Execute, requests: list[Any], sent: list[list[Any]], t0: int, t1: int
    ) -> msg.Result | None:
        if self.decoupled:
            rescheduled = self._run_decoupled(requests, execute.requests)
            timings = (t1 - t0, time.perf_counter_ns() - t1, 0)
            return msg.Result(execute.batch_id, [], timings, rescheduled)
        batch = _Batch(execute, requests, sent, t0, t1)
        try:
            result = self.model.execute(requests)
            if type(result) is not list and inspect.isawaitable(result):
                if self.concurrent:
                    future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                        result,  # type: ignore[arg-type]
                        self._event_loop(),
                    )
                    future.add_done_callback(lambda done: self._send_finished(batch, done))
                    return None
                result = self.await_result(result)
        except Exception as error:  # the model's failure fails its requests, not the stub
            return self._failed(batch, self.failure(f"{type(error).__name__}: {error}"))
        return self._finish(batch, result)

    def _dropped(self, execute: msg.Execute) -> msg.Result:
        """A batch cancelled while it waited in the ring is not executed, as Triton drops
        cancelled requests from its queues."""
        self._untrack([r.key for r in execute.requests])
        cancelled = msg.ResponseRecord(error=("CANCELLED", "the request was cancelled"))
        if self.decoupled:
            for record in execute.requests:
                self.send(msg.Response(record.key, cancelled, True))
            return msg.Result(execute.batch_id, [], (0, 0, 0), executed=False)
        responses = [cancelled] * len(execute.requests)
        return msg.Result(execute.batch_id, responses, (0, 0, 0), executed=False)

    def _send_finished(self, batch: _Batch, done: concurrent.futures.Future[Any]) -> None:
        error = done.exception()
        if error is not None:
            result: msg.Result | None = self._failed(
                batch, self.failure(f"{type(error).__name__}: {error}")
            )
        else:
            result = self._finish(batch, done.result())
        if result is not None:
            self._send_result(result)

    def _send_result(self, result: msg.Result) -> None:
        try:
            self.send(result)
        except Exception:
            log.exception("could not send the result of an execute")

    def _failed(self, batch: _Batch, text: str) -> msg.Result:
        self._untrack([r.key for r in batch.execute.requests])
        for request in batch.requests:
            request.get_response_sender()._close()
        failure = msg.ResponseRecord(error=("INTERNAL", text))
        t2 = time.perf_counter_ns()
        records = [
            self.record(delivered[0], record) if delivered else failure
            for delivered, record in zip(batch.sent, batch.execute.requests, strict=True)
        ]
        timings = (batch.t1 - batch.t0, t2 - batch.t1, 0)
        return msg.Result(batch.execute.batch_id, records, timings)

    def _finish(self, batch: _Batch, result: Any) -> msg.Result | None:
        """The batch's Result; None when responses are still to come through senders (the
        Result goes up once the last of them arrives)."""
        try:
            responses = self._check_return(result, len(batch.requests))
            rescheduled = self._rescheduled(batch.requests, responses)
        except ExecuteError as error:
            return self._failed(batch, str(error))
        self._untrack([r.key for r in batch.execute.requests])
        responses = [
            None if i in rescheduled else self._settle(returned, request, delivered)
            for i, (returned, request, delivered) in enumerate(
                zip(responses, batch.requests, batch.sent, strict=True)
            )
        ]
        waiting = [
            i
            for i, (response, request) in enumerate(zip(responses, batch.requests, strict=True))
            if response is None and i not in rescheduled and request._awaits_sender()
        ]
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

    def _result(self, batch: _Batch, responses: list[Any], rescheduled: list[int]) -> msg.Result:
        t2 = time.perf_counter_ns()
        records = [
            msg.ResponseRecord() if i in rescheduled else self.record(resp, record)
            for i, (resp, record) in enumerate(zip(responses, batch.execute.requests, strict=True))
        ]
        t3 = time.perf_counter_ns()
        timings = (batch.t1 - batch.t0, t2 - batch.t1, t3 - t2)
        return msg.Result(batch.execute.batch_id, records, timings, rescheduled)

    def _rescheduled(self, requests: list[Any], responses: list[Any]) -> list[int]:
        """Positions of the requests released with RESCHEDULE; each must have returned None."""
        positions = [i for i, r in enumerate(requests) if r._release_flags() == RESCHEDULE]
        for i in positions:
            if responses[i] is not None:
                raise ExecuteError(  # Triton's words, its spelling ("reschduled") included
                    self.failure(
                        "Expected a None object in the execute function return list for "
                        f"reschduled request, found type '{type(responses[i]).__name__}'."
                    )
                )
        return positions

    # -- requests ---------------------------------------------------------------------------

    def _request(self, record: msg.RequestRecord, delivered: list[Any]) -> Any:
        tensors = []
        for i, desc in enumerate(record.inputs):
            if type(desc.location) in _ON_A_GPU:
                assert self.writer.gpu is not None
                tensors.append(self.writer.gpu.input_tensor(desc))
                continue
            tensors.append(self._cpu_input(desc, bool(record.private_inputs >> i & 1)))
        if self.decoupled:
            deliver = self._stream_to(record)
        else:
            key = record.key

            def deliver(response: Any, flags: int) -> None:
                if response is None:
                    return
                with self._late_lock:
                    delivered.append(response)
                    late = self._late.pop(key, None)
                if late is not None:
                    late()

        return pb_utils.InferenceRequest._from_server(
            request_id=record.request_id,
            correlation_id=record.correlation_id,
            inputs=tensors,
            requested_output_names=record.requested_outputs,
            flags=record.flags,
            parameters={k: v for k, v in record.parameters.items() if k not in _RESERVED},
            timeout=record.timeout_us,
            model_name="",
            model_version=-1,
            deliver=deliver,
            decoupled=self.decoupled,
            trace_context=record.trace_context or None,
        )

    def _cpu_input(self, desc: TensorDesc, private: bool) -> Any:
        """An input the model owns, as on Triton: it may write the array ``as_numpy()`` gives.

        A block staged for this request alone is the array itself (no copy either way), and
        can be handed back by descriptor as an output, written or not. Anything others may
        read too (client regions, ensemble and BLS tensors) is seen through a private view.
        """
        view = self.input_view(desc.location)
        if desc.datatype == "BYTES":  # decoded into objects: already the model's own
            array = buffer_to_numpy(desc.datatype, desc.shape, view)
        elif private and type(desc.location) is Block:
            array = buffer_to_numpy(desc.datatype, desc.shape, view, readonly=False)
            self.writer.locations.remember(array, desc, returnable=True)
        else:
            # Not remembered: its bytes may differ from the block's once the model wrote it.
            writable = self.private_view(desc.location, view)
            array = buffer_to_numpy(desc.datatype, desc.shape, writable, readonly=False)
        return pb_utils.Tensor._wrap(desc.name, array, desc.datatype)

    def _stream_to(self, record: msg.RequestRecord) -> Callable[[Any, int], None]:
        def deliver(response: Any, flags: int) -> None:
            body = None if response is None else self.record(response, record)
            final = bool(flags & FINAL)
            if final:
                self._untrack([record.key])
            self.send(msg.Response(record.key, body, final))

        return deliver

    # -- execute ----------------------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """A loop on its own thread for ``async def execute`` (BLS awaits run there too)."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="model-asyncio", daemon=True).start()
                self._loop = loop
            return self._loop

    def await_result(self, awaitable: Any) -> Any:
        """Run a coroutine of the model to completion on the model's event loop."""
        future = asyncio.run_coroutine_threadsafe(awaitable, self._event_loop())
        return future.result()

    def _run_decoupled(self, requests: list[Any], records: list[msg.RequestRecord]) -> list[int]:
        """Run a decoupled execute; returns the positions of the requests it rescheduled."""
        try:
            result = self.model.execute(requests)
            if type(result) is not list and inspect.isawaitable(result):
                # Triton: a decoupled coroutine runs on in the background; execute is done.
                future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                    result,  # type: ignore[arg-type]
                    self._event_loop(),
                )
                future.add_done_callback(lambda f: self._after_async(f, requests, records))
                return []
            if result is not None:
                raise ExecuteError(
                    self.failure(
                        f"Python model '{self.instance}' is using the decoupled mode and the "
                        "execute function must return None."
                    )
                )
        except Exception as error:
            text = (
                str(error)
                if isinstance(error, ExecuteError)
                else self.failure(f"{type(error).__name__}: {error}")
            )
            self._fail_open(requests, records, text)
            return []  # after an error every request is released with RELEASE_ALL, as in Triton
        # Triton reads the release flags once execute returned: the request runs again.
        rescheduled = [i for i, r in enumerate(requests) if r._release_flags() == RESCHEDULE]
        self._untrack([records[i].key for i in rescheduled])
        return rescheduled

    def _after_async(
        self,
        future: concurrent.futures.Future[Any],
        requests: list[Any],
        records: list[msg.RequestRecord],
    ) -> None:
        error = future.exception()
        if error is not None:
            self._fail_open(requests, records, self.failure(f"{type(error).__name__}: {error}"))

    def _fail_open(self, requests: list[Any], records: list[msg.RequestRecord], text: str) -> None:
        """Send an error as the final response of every request whose sender is still open;
        an error no client can receive any more (every sender sent FINAL) goes to the log."""
        delivered = False
        for request, record in zip(requests, records, strict=True):
            sender = request.get_response_sender()
            if not sender._is_closed():
                sender._close()
                self._untrack([record.key])
                error = msg.ResponseRecord(error=("INTERNAL", text))
                self.send(msg.Response(record.key, error, True))
                delivered = True
        if not delivered:
            pb_utils.Logger.log_error(text)

    def failure(self, text: str) -> str:
        return f"Failed to process the request(s) for model '{self.instance}', message: {text}"

    def _check_return(self, result: Any, count: int) -> list[Any]:
        if result is None:  # every request is answered through its response sender
            return [None] * count
        if not isinstance(result, list):
            raise ExecuteError(
                self.failure(
                    f"Expected a list in the execute return, found type '{type(result).__name__}'."
                )
            )
        if len(result) != count:
            raise ExecuteError(
                self.failure(
                    "Number of InferenceResponse objects do not match the number of "
                    f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                    f"InferenceResponse(s) size is:{len(result)}"
                )
            )
        for item in result:
            if item is not None and not isinstance(item, pb_utils.InferenceResponse):
                raise ExecuteError(
                    self.failure(
                        "Expected an 'InferenceResponse' object in the execute function return "
                        f"list, found type '{type(item).__name__}'."
                    )
                )
        return result

    def _settle(self, returned: Any, request: Any, delivered: list[Any]) -> Any:
        """The one response of a request: returned from execute, or sent through its sender.
        One sent with FINAL and also returned: the sent one, as in Triton (the sender was
        closed; the returned one is dropped with a warning)."""
        if returned is None:
            return delivered[0] if delivered else None
        if delivered and request.get_response_sender()._is_closed():
            log.warning(
                "%s",
                self.failure(
                    "a response was returned for a request whose response sender already "
                    "sent its response and the final flag: the returned one is dropped"
                ),
            )
            return delivered[0]
        try:
            request.get_response_sender()._mark_returned(returned)
        except pb_utils.TritonModelException as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
        return returned

    # -- responses --------------------------------------------------------------------------

    def record(self, response: Any, request: msg.RequestRecord) -> msg.ResponseRecord:
        """A response as a record: outputs written once, unrequested outputs dropped."""
        if response is None:
            return msg.ResponseRecord(
                error=(
                    "INTERNAL",
                    self.failure(
                        "execute returned None for a request and sent no response for it "
                        "through its response sender"
                    ),
                )
            )
        if response.has_error():
            error = response.error()
            code = response._error_code_name() or "INTERNAL"
            return msg.ResponseRecord(error=(code, str(error.message())))
        requested = set(request.requested_outputs)
        written: Written = []
        outputs: list[TensorDesc] = []
        try:
            for tensor in response.output_tensors():
                if requested and tensor.name() not in requested:
                    continue  # Triton drops outputs that were not requested
                target = request.output_regions.get(tensor.name())
                if type(target) is CudaRegionLocation:
                    assert self.writer.gpu is not None
                    outputs.append(self.writer.gpu.place(tensor, target))
                elif target is not None:
                    assert isinstance(target, RegionLocation)
                    outputs.append(self.writer.place(tensor, target))
                else:
                    outputs.append(self.writer.describe(tensor, written, for_response=True))
        except (ArenaExhausted, CudaPoolRefused) as error:
            self.writer.free(written)
            return msg.ResponseRecord(error=("RESOURCE_EXHAUSTED", self.failure(str(error))))
        except (RegionTooSmall, RegionShrunk) as error:
            self.writer.free(written)
            return msg.ResponseRecord(error=("INVALID_ARG", str(error)))
        except (TypeError, ValueError) as error:
            self.writer.free(written)
            return msg.ResponseRecord(error=("INTERNAL", self.failure(str(error))))
        except Exception as error:  # a CUDA error, say: this response fails, not the stub
            self.writer.free(written)
            text = self.failure(f"{type(error).__name__}: {error}")
            return msg.ResponseRecord(error=("INTERNAL", text))
        # The dict itself, not parameters()'s JSON text: no dumps and loads per response.
        parameters = dict(response._parameters_dict())
        return msg.ResponseRecord(outputs=outputs, parameters=parameters)
