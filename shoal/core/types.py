"""Transport-neutral request and response objects of the core API.

Frontends build :class:`InferRequest` from their wire format and render :class:`InferResponse`;
both frontends use exactly these types.

Tensor payloads use the KServe V2 binary layout: little-endian elements in row-major order, and for
BYTES each element as a 4-byte little-endian length followed by its bytes.

Shared memory (Triton's system shared-memory extension): an input whose ``parameters`` carry
``shared_memory_region`` (+ ``shared_memory_offset``, ``shared_memory_byte_size``) has empty
``data``; the core reads the region. A requested output with those parameters is written into the
region by the core, and its :class:`InferOutput` keeps the parameters and has empty ``data``:
frontends then send no data for it (neither JSON nor binary), as Triton does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from shoal.core.errors import ShoalError
from shoal.ipc.arena import Block

#: Parameter values allowed by the KServe V2 protocol.
ParamValue = bool | int | float | str

#: A trace setting as reported: a list for ``trace_level``, a string otherwise.
TraceValue = str | list[str]
#: A requested change of a trace setting: None clears a model's setting.
TraceChange = str | int | Sequence[str] | None


#: memoryview by another name: a dataclass field annotated ``memoryview`` itself fails to import
#: once mypyc compiles this module (a KeyError); an alias does not.
View: TypeAlias = memoryview


@dataclass
class InferInput:
    """One input tensor of a request.

    ``data`` holds the raw bytes in the V2 binary layout (any object supporting the buffer protocol,
    e.g. a slice of the HTTP body) or a NumPy array already of the right dtype (JSON inputs).

    ``placed``: ``data`` already lies in this shared-memory block (a frontend worker staged it
    in its own arena), so the core passes the block on instead of copying. The request owns the
    block until staging takes it (and sets ``placed`` to None); whoever made the request gives
    back a block still placed once the request is answered.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: memoryview | bytes | np.ndarray
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    placed: Block | None = None

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        data: memoryview | bytes | np.ndarray,
        parameters: dict[str, ParamValue] | None = None,
        placed: Block | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.data = data
        self.parameters = {} if parameters is None else parameters
        self.placed = placed


@dataclass
class RequestedOutput:
    """An output the client asked for by name."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)

    def __init__(self, name: str, parameters: dict[str, ParamValue] | None = None) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.name = name
        self.parameters = {} if parameters is None else parameters


@dataclass
class InferRequest:
    """One inference request, as both frontends hand it to :meth:`Core.infer`."""

    model_name: str
    model_version: str = ""  # "" means: the version policy's choice
    id: str = ""
    inputs: list[InferInput] = field(default_factory=list)
    #: Empty means "all outputs of the model".
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)

    def __init__(
        self,
        model_name: str,
        model_version: str = "",
        id: str = "",
        inputs: list[InferInput] | None = None,
        outputs: list[RequestedOutput] | None = None,
        parameters: dict[str, ParamValue] | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs = [] if inputs is None else inputs
        self.outputs = [] if outputs is None else outputs
        self.parameters = {} if parameters is None else parameters
        #: Its trace: -1 where its frontend will hand its own timestamps to the trace file,
        #: the frontend says (``trace_files``); then the id of its trace, if the core sampled
        #: it (0: none). Not a field: never sent to a frontend worker's core.
        self.trace_id = 0


@dataclass
class InferOutput:
    """One output tensor of a response.

    ``data`` is a read-only view of the raw bytes in V2 binary layout; it stays valid until the
    response's ``release`` is called. ``placed``: the shared-memory block ``data`` views, which
    another process (a frontend worker) may map to read it in place.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: View
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    placed: Block | None = None

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        data: View,
        parameters: dict[str, ParamValue] | None = None,
        placed: Block | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.data = data
        self.parameters = {} if parameters is None else parameters
        self.placed = placed

    def as_numpy(self) -> np.ndarray:
        """Decode into a NumPy array (BYTES become an object array of ``bytes``)."""
        from shoal.ipc.tensor import buffer_to_numpy

        return buffer_to_numpy(self.datatype, self.shape, self.data)


@dataclass
class InferResponse:
    """The response to one :class:`InferRequest`.

    The frontend must call :meth:`release` once it has written the outputs to the client, so the
    shared-memory blocks behind ``outputs[i].data`` return to their arena.
    """

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[InferOutput] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    _release: Callable[[], None] | None = field(default=None, repr=False)
    #: In a stream: whether this is the request's last response (always, for a model that is
    #: not decoupled; for a decoupled one, when the model sent it with the final flag).
    final: bool = True
    #: In a stream: an error response the decoupled model sent (no outputs); the stream goes
    #: on unless ``final``. ``infer`` raises errors instead.
    error: ShoalError | None = None

    def __init__(
        self,
        model_name: str,
        model_version: str,
        id: str = "",
        outputs: list[InferOutput] | None = None,
        parameters: dict[str, ParamValue] | None = None,
        _release: Callable[[], None] | None = None,
        final: bool = True,
        error: ShoalError | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.outputs = [] if outputs is None else outputs
        self.parameters = {} if parameters is None else parameters
        self._release = _release
        self.final = final
        self.error = error

    def release(self) -> None:
        """Return the response's shared-memory blocks. Idempotent."""
        release, self._release = self._release, None
        if release is not None:
            release()


@dataclass(frozen=True)
class TensorMetadata:
    """Name, datatype and shape of a model input or output (-1 for variable dims)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    """What ``GET /v2/models/{m}`` reports."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True)
class ServerMetadata:
    """What ``GET /v2`` reports."""

    name: str
    version: str
    extensions: tuple[str, ...]


JsonDict = dict[str, Any]


@dataclass
class StatDuration:
    """A count and the total nanoseconds it took (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass
class InferStatistics:
    """Triton's InferStatistics: per-request outcomes and per-stage durations."""

    success: StatDuration = field(default_factory=StatDuration)
    fail: StatDuration = field(default_factory=StatDuration)
    queue: StatDuration = field(default_factory=StatDuration)
    compute_input: StatDuration = field(default_factory=StatDuration)
    compute_infer: StatDuration = field(default_factory=StatDuration)
    compute_output: StatDuration = field(default_factory=StatDuration)
    cache_hit: StatDuration = field(default_factory=StatDuration)
    cache_miss: StatDuration = field(default_factory=StatDuration)


@dataclass
class BatchStatistics:
    """Triton's InferBatchStatistics: executions of one batch size."""

    batch_size: int
    compute_input: StatDuration = field(default_factory=StatDuration)
    compute_infer: StatDuration = field(default_factory=StatDuration)
    compute_output: StatDuration = field(default_factory=StatDuration)


@dataclass
class ResponseStatistics:
    """Triton's InferResponseStatistics (decoupled models), keyed by response index."""

    compute_infer: StatDuration = field(default_factory=StatDuration)
    compute_output: StatDuration = field(default_factory=StatDuration)
    success: StatDuration = field(default_factory=StatDuration)
    fail: StatDuration = field(default_factory=StatDuration)
    empty_response: StatDuration = field(default_factory=StatDuration)
    cancel: StatDuration = field(default_factory=StatDuration)


@dataclass
class MemoryUsage:
    type: str  # "CPU", "CPU_PINNED", "GPU"
    id: int
    byte_size: int


@dataclass
class ModelStatistics:
    """One entry of Triton's statistics extension (``/v2/models/{m}/stats``)."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch
    inference_count: int = 0
    execution_count: int = 0
    inference_stats: InferStatistics = field(default_factory=InferStatistics)
    batch_stats: list[BatchStatistics] = field(default_factory=list)
    response_stats: dict[str, ResponseStatistics] = field(default_factory=dict)
    memory_usage: list[MemoryUsage] = field(default_factory=list)
    #: Failed requests by Triton's failure reason (the ``nv_inference_request_failure`` metric);
    #: not part of the statistics extension.
    failure_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RepositoryEntry:
    """One row of the repository index: a model (version) and its state."""

    name: str
    version: str = ""
    state: str = ""  # "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
    reason: str = ""


@dataclass(frozen=True)
class SharedMemoryRegion:
    """A client's registered system shared-memory region."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class CudaSharedMemoryRegion:
    """A client's registered CUDA shared-memory region (a cudaIpcMemHandle it exported)."""

    name: str
    device_id: int
    byte_size: int
