"""A model's ``InferenceResponse`` as a :class:`~shoal.ipc.records.ResponseRecord`: each
requested output written once (into the stub's output arena, a CUDA pool block, or the
client's region it was asked into), the others dropped as Triton drops them."""

from __future__ import annotations

from typing import Any

from shoal.ipc.arena import ArenaExhausted
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.ipc.tensor import CudaRegionLocation, InlineBytes, RegionLocation, TensorDesc
from shoal.stub.execute_checks import failure_text
from shoal.stub.gpu_tensors import CudaPoolRefused
from shoal.stub.memory import RegionReplaced, RegionShrunk, RegionTooSmall
from shoal.stub.tensors_out import TensorWriter, Written


class ResponseRecorder:
    """Turns the responses of one instance's model into records."""

    def __init__(self, instance: str, writer: TensorWriter) -> None:
        self.instance = instance
        self.writer = writer

    def record(self, response: Any, request: RequestRecord) -> ResponseRecord:
        """A response as a record: outputs written once, unrequested outputs dropped."""
        if response is None:
            return self._error(
                "INTERNAL",
                "execute returned None for a request and sent no response for it "
                "through its response sender",
            )
        # Fields, not methods, as Triton reads the response object (each call of the
        # interpreted layer costs ~600 instructions).
        failed = response._error
        if failed is not None:
            code = response._error_code_name() or "INTERNAL"
            return ResponseRecord(error=(code, str(failed.message())))
        written: Written = []
        try:
            outputs = self._write_outputs(response, request, written)
        except Exception as error:
            self.writer.free(written)
            return self._write_failed(error)
        # The dict itself, not parameters()'s JSON text: no dumps and loads per response. Not
        # a copy either: the response's own dict, checked when it was built, is never changed.
        return ResponseRecord(outputs, None, response._parameters)

    def _write_outputs(
        self, response: Any, request: RequestRecord, written: Written
    ) -> list[TensorDesc]:
        # The response's own list, as Triton reads its outputs from the response object and
        # never calls the Python method.
        tensors = response._outputs
        if request.requested_outputs:
            requested = set(request.requested_outputs)
            # Triton drops outputs that were not requested.
            tensors = [tensor for tensor in tensors if tensor._name in requested]
        descs: list[TensorDesc] = []
        room = self.writer.inline_budget  # small outputs travel inside the record, up to this
        for tensor in tensors:
            desc = self._write_output(tensor, request, written, room)
            location = desc.location
            if type(location) is InlineBytes:
                room -= location.nbytes
            descs.append(desc)
        return descs

    def _write_output(
        self, tensor: Any, request: RequestRecord, written: Written, room: int
    ) -> TensorDesc:
        if not request.output_regions:
            return self.writer.describe(tensor, written, for_response=True, inline_room=room)
        target = request.output_regions.get(tensor.name())
        if type(target) is CudaRegionLocation:
            assert self.writer.gpu is not None
            return self.writer.gpu.place(tensor, target)
        if target is not None:
            assert isinstance(target, RegionLocation)
            return self.writer.place(tensor, target)
        return self.writer.describe(tensor, written, for_response=True, inline_room=room)

    def _write_failed(self, error: Exception) -> ResponseRecord:
        """This response fails (the arena is full, a CUDA error, say), not the stub."""
        if isinstance(error, ArenaExhausted | CudaPoolRefused):
            return self._error("RESOURCE_EXHAUSTED", str(error))
        if isinstance(error, RegionTooSmall | RegionShrunk | RegionReplaced):
            return ResponseRecord(error=("INVALID_ARG", str(error)))
        if isinstance(error, TypeError | ValueError):
            return self._error("INTERNAL", str(error))
        return self._error("INTERNAL", f"{type(error).__name__}: {error}")

    def _error(self, code: str, text: str) -> ResponseRecord:
        return ResponseRecord(error=(code, failure_text(self.instance, text)))
