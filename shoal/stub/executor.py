"""Run one batch through the model's ``execute`` and turn its return value into a Result."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaExhausted, Block, OwnedArena
from shoal.ipc.tensor import TensorDesc, buffer_to_numpy, numpy_to_buffer_size, write_numpy
from shoal.stub import pb_utils


class ExecuteError(Exception):
    """The model's execute raised or returned something Triton's contract forbids."""


class BatchExecutor:
    """Builds pb_utils requests over shared memory, calls execute, writes outputs once."""

    def __init__(
        self,
        instance: str,
        model: Any,
        outputs: OwnedArena,
        input_view: Callable[[Block], memoryview],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.instance = instance
        self.model = model
        self.outputs = outputs
        self.input_view = input_view
        self.loop = loop

    def run(self, execute: msg.Execute) -> msg.Result:
        t0 = time.perf_counter_ns()
        # Arrays that are zero-copy views of input blocks: returning one unchanged as an output
        # passes its block back instead of copying it.
        input_blocks: dict[int, tuple[TensorDesc, Any]] = {}
        # What each request's response sender delivered (Triton's default-mode sender: one
        # response and FINAL, with execute returning None for that request).
        sent: list[list[Any]] = [[] for _ in execute.requests]
        requests = [
            self._request(record, input_blocks, sent[i])
            for i, record in enumerate(execute.requests)
        ]
        t1 = time.perf_counter_ns()
        try:
            responses = self._call_execute(requests)
        except ExecuteError as error:
            for request in requests:
                request.get_response_sender()._close()
            failure = msg.ResponseRecord(error=("INTERNAL", str(error)))
            t2 = time.perf_counter_ns()
            records = [
                self._response(delivered[0], record, input_blocks) if delivered else failure
                for delivered, record in zip(sent, execute.requests, strict=True)
            ]
            return msg.Result(execute.batch_id, records, (t1 - t0, t2 - t1, 0))
        responses = [
            self._settle(returned, request, delivered)
            for returned, request, delivered in zip(responses, requests, sent, strict=True)
        ]
        t2 = time.perf_counter_ns()
        records = [
            self._response(resp, record, input_blocks)
            for resp, record in zip(responses, execute.requests, strict=True)
        ]
        t3 = time.perf_counter_ns()
        return msg.Result(execute.batch_id, records, (t1 - t0, t2 - t1, t3 - t2))

    # -- requests ---------------------------------------------------------------------------

    def _request(
        self,
        record: msg.RequestRecord,
        input_blocks: dict[int, tuple[TensorDesc, Any]],
        delivered: list[Any],
    ) -> Any:
        tensors = []
        for desc in record.inputs:
            assert isinstance(desc.location, Block)
            view = self.input_view(desc.location)
            array = buffer_to_numpy(desc.datatype, desc.shape, view, readonly=True)
            if desc.datatype != "BYTES":
                input_blocks[id(array)] = (desc, array)
            tensors.append(pb_utils.Tensor._wrap(desc.name, array, desc.datatype))
        return pb_utils.InferenceRequest._from_server(
            request_id=record.request_id,
            correlation_id=record.correlation_id,
            inputs=tensors,
            requested_output_names=record.requested_outputs,
            flags=record.flags,
            parameters=record.parameters,
            timeout=record.timeout_us,
            model_name="",
            model_version=-1,
            deliver=lambda response, flags: delivered.append(response) if response else None,
            decoupled=False,
        )

    # -- execute ----------------------------------------------------------------------------

    def _call_execute(self, requests: list[Any]) -> list[Any]:
        try:
            result = self.model.execute(requests)
            if inspect.isawaitable(result):
                result = self.loop.run_until_complete(result)
        except Exception as error:  # the model's failure fails its requests, not the stub
            raise ExecuteError(self._failure(f"{type(error).__name__}: {error}")) from error
        return self._check_return(result, len(requests))

    def _failure(self, text: str) -> str:
        return f"Failed to process the request(s) for model '{self.instance}', message: {text}"

    def _check_return(self, result: Any, count: int) -> list[Any]:
        if not isinstance(result, list):
            raise ExecuteError(
                self._failure(
                    f"Expected a list in the execute return, found type '{type(result).__name__}'."
                )
            )
        if len(result) != count:
            raise ExecuteError(
                self._failure(
                    "Number of InferenceResponse objects do not match the number of "
                    f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                    f"InferenceResponse(s) size is:{len(result)}"
                )
            )
        for item in result:
            if item is not None and not isinstance(item, pb_utils.InferenceResponse):
                raise ExecuteError(
                    self._failure(
                        "Expected an 'InferenceResponse' object in the execute function return "
                        f"list, found type '{type(item).__name__}'."
                    )
                )
        return result

    def _settle(self, returned: Any, request: Any, delivered: list[Any]) -> Any:
        """The one response of a request: returned from execute, or sent through its sender."""
        if returned is None:
            return delivered[0] if delivered else None
        try:
            request.get_response_sender()._mark_returned(returned)
        except pb_utils.TritonModelException as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
        return returned

    # -- responses --------------------------------------------------------------------------

    def _response(
        self,
        response: Any,
        record: msg.RequestRecord,
        input_blocks: dict[int, tuple[TensorDesc, Any]],
    ) -> msg.ResponseRecord:
        if response is None:
            return msg.ResponseRecord(
                error=(
                    "INTERNAL",
                    self._failure(
                        "execute returned None for a request and sent no response for it "
                        "through its response sender"
                    ),
                )
            )
        if response.has_error():
            error = response.error()
            code = response._error_code_name() or "INTERNAL"
            return msg.ResponseRecord(error=(code, str(error.message())))
        requested = set(record.requested_outputs)
        written: list[Block] = []
        outputs: list[TensorDesc] = []
        try:
            for tensor in response.output_tensors():
                if requested and tensor.name() not in requested:
                    continue  # Triton drops outputs that were not requested
                outputs.append(self._write_output(tensor, input_blocks, written))
        except ArenaExhausted as error:
            for block in written:
                self.outputs.free(block)
            return msg.ResponseRecord(error=("RESOURCE_EXHAUSTED", self._failure(str(error))))
        except (TypeError, ValueError) as error:
            for block in written:
                self.outputs.free(block)
            return msg.ResponseRecord(error=("INTERNAL", self._failure(str(error))))
        params = response.parameters()
        return msg.ResponseRecord(outputs=outputs, parameters=_json_params(params))

    def _write_output(
        self,
        tensor: Any,
        input_blocks: dict[int, tuple[TensorDesc, Any]],
        written: list[Block],
    ) -> TensorDesc:
        array = tensor._array()
        datatype = tensor._datatype()
        shape = tuple(int(d) for d in array.shape)
        passed = input_blocks.get(id(array))
        if passed is not None and passed[0].datatype == datatype:
            return TensorDesc(tensor.name(), datatype, shape, passed[0].location)
        block = self.outputs.allocate(numpy_to_buffer_size(array, datatype))
        written.append(block)
        write_numpy(array, datatype, self.outputs.view(block))
        return TensorDesc(tensor.name(), datatype, shape, block)


def _json_params(params: str | dict[str, Any] | None) -> dict[str, Any]:
    if not params:
        return {}
    if isinstance(params, dict):
        return params
    import json

    loaded = json.loads(params)
    return loaded if isinstance(loaded, dict) else {}
