"""Transport-neutral request and response objects of the core API.

Frontends build :class:`InferRequest` from their wire format and render :class:`InferResponse`;
both frontends use exactly these types.

Tensor payloads use the KServe V2 binary layout: little-endian elements in row-major order, and for
BYTES each element as a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Parameter values allowed by the KServe V2 protocol.
ParamValue = bool | int | float | str


@dataclass
class InferInput:
    """One input tensor of a request.

    ``data`` holds the raw bytes in the V2 binary layout (any object supporting the buffer protocol,
    e.g. a slice of the HTTP body) or a NumPy array already of the right dtype (JSON inputs).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: memoryview | bytes | np.ndarray
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    """An output the client asked for by name."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


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


@dataclass
class InferOutput:
    """One output tensor of a response.

    ``data`` is a read-only view of the raw bytes in V2 binary layout; it stays valid until the
    response's ``release`` is called.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: memoryview
    parameters: dict[str, ParamValue] = field(default_factory=dict)

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
