"""The request and response records that batch messages carry, with their wire lists.

A :class:`RequestRecord` is one request of an :class:`~shoal.ipc.model_messages.Execute` (or a
BLS call), as the stub rebuilds it into a ``pb_utils.InferenceRequest``; a
:class:`ResponseRecord` is one answer. Tensors travel as
:class:`~shoal.ipc.tensor.TensorDesc` wire lists, never as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.ipc.tensor import (
    CudaRegionLocation,
    RegionLocation,
    TensorDesc,
    location_from_wire,
    location_to_wire,
)


@dataclass(slots=True)
class RequestRecord:
    """One request of a batch, as the stub rebuilds it into a ``pb_utils.InferenceRequest``."""

    request_id: str
    correlation_id: int | str
    flags: int
    parameters: dict[str, Any]
    requested_outputs: list[str]
    inputs: list[TensorDesc]
    timeout_us: int = 0
    #: Identifies the request to its stub across messages (decoupled responses).
    key: int = 0
    #: Outputs the stub writes straight into a client's shared-memory region (system or
    #: CUDA), by name.
    output_regions: dict[str, RegionLocation | CudaRegionLocation] = field(default_factory=dict)
    #: Bit ``i`` set: input ``i`` lies in a block staged for this request alone, which the
    #: model may write in place; any other input is made writable by a private mapping.
    private_inputs: int = 0
    #: The request's trace context (``request.trace().get_context()``); "" when not traced.
    trace_context: str = ""
    #: A request a frontend worker checked and packed (``frontends/workers/packing.py``): the
    #: MessagePack of its wire form up to ``timeout_us`` (the array's header for all eleven
    #: fields first), which the Execute splices in before the fields packed here
    #: (``messages.encode``); ``inputs`` is then empty. None: the whole record is packed here.
    packed: bytes | memoryview | None = field(default=None)

    def __init__(
        self,
        request_id: str,
        correlation_id: int | str,
        flags: int,
        parameters: dict[str, Any],
        requested_outputs: list[str],
        inputs: list[TensorDesc],
        timeout_us: int = 0,
        key: int = 0,
        output_regions: dict[str, RegionLocation | CudaRegionLocation] | None = None,
        private_inputs: int = 0,
        trace_context: str = "",
        packed: bytes | memoryview | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.request_id = request_id
        self.correlation_id = correlation_id
        self.flags = flags
        self.parameters = parameters
        self.requested_outputs = requested_outputs
        self.inputs = inputs
        self.timeout_us = timeout_us
        self.key = key
        self.output_regions = {} if output_regions is None else output_regions
        self.private_inputs = private_inputs
        self.trace_context = trace_context
        self.packed = packed

    def to_wire(self) -> list[Any]:
        regions = self.output_regions
        return [
            self.request_id,
            self.correlation_id,
            self.flags,
            self.parameters,
            self.requested_outputs,
            [t.to_wire() for t in self.inputs],
            self.timeout_us,
            self.key,
            # (empty, nearly always: packed as it is, the same bytes as an empty copy)
            {name: location_to_wire(r) for name, r in regions.items()} if regions else regions,
            self.private_inputs,
            self.trace_context,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> RequestRecord:
        inputs = [TensorDesc.from_wire(t) for t in w[5]]
        regions = {name: _region_from_wire(r) for name, r in w[8].items()}
        # By name, not cls(): compiled, that is a native constructor call, cls() a generic one.
        return RequestRecord(w[0], w[1], w[2], w[3], w[4], inputs, w[6], w[7], regions, w[9], w[10])


def _region_from_wire(obj: list[Any]) -> RegionLocation | CudaRegionLocation:
    location = location_from_wire(obj)
    if not isinstance(location, RegionLocation | CudaRegionLocation):
        raise ValueError(f"an output region must be a client's region, got {obj!r}")
    return location


@dataclass(slots=True)
class ResponseRecord:
    """The answer to one request: outputs, or an error with a TritonError code name."""

    outputs: list[TensorDesc] = field(default_factory=list)
    error: tuple[str, str] | None = None  # (code name, message)
    parameters: dict[str, Any] = field(default_factory=dict)
    #: A record the core relays to a frontend worker undecoded: its bytes as the stub packed
    #: them (a whole Result's, ``ipc/whole_results.py``); ``outputs`` and ``parameters`` are
    #: then empty, and the outputs own no block (only inline outputs travel so). None: decoded.
    whole: memoryview | None = None

    def __init__(
        self,
        outputs: list[TensorDesc] | None = None,
        error: tuple[str, str] | None = None,
        parameters: dict[str, Any] | None = None,
        whole: memoryview | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.outputs = [] if outputs is None else outputs
        self.error = error
        self.parameters = {} if parameters is None else parameters
        self.whole = whole

    def to_wire(self) -> list[Any]:
        return [[t.to_wire() for t in self.outputs], self.error, self.parameters]

    @classmethod
    def from_wire(cls, w: list[Any]) -> ResponseRecord:
        error = None if w[1] is None else (w[1][0], w[1][1])
        # By name, not cls(): compiled, that is a native constructor call, cls() a generic one.
        return ResponseRecord([TensorDesc.from_wire(t) for t in w[0]], error, w[2])
