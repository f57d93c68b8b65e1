"""The core API that every frontend calls.

Frontends (HTTP, gRPC) import only this module: the request/response types, the error hierarchy and
the :class:`CoreAPI` protocol that the supervisor implements.
"""

from __future__ import annotations

from typing import Protocol

from shoal.supervisor.errors import (
    Cancelled,
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ShoalError,
    Unavailable,
    Unsupported,
)
from shoal.supervisor.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    JsonDict,
    ModelMetadata,
    ParamValue,
    RequestedOutput,
    ServerMetadata,
    TensorMetadata,
)

__all__ = [
    "Cancelled",
    "CoreAPI",
    "DeadlineExceeded",
    "ErrorCode",
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "InternalError",
    "InvalidArgument",
    "JsonDict",
    "ModelMetadata",
    "NotFound",
    "ParamValue",
    "RequestedOutput",
    "ResourceExhausted",
    "ServerMetadata",
    "ShoalError",
    "TensorMetadata",
    "Unavailable",
    "Unsupported",
]


class CoreAPI(Protocol):
    """What frontends may ask of the server. Methods raise :class:`ShoalError` subclasses."""

    def is_live(self) -> bool:
        """True while the server process is up and not shutting down."""
        ...

    def is_ready(self) -> bool:
        """True when the server accepts inference (every model ready, unless not strict)."""
        ...

    def server_metadata(self) -> ServerMetadata:
        """Name, version and supported protocol extensions."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (version) can serve; False (not an error) for unknown models."""
        ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """Metadata of a loaded model; NotFound / Unavailable otherwise."""
        ...

    def model_config(self, name: str, version: str = "") -> JsonDict:
        """The model's configuration in Triton's JSON form."""
        ...

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one inference request; the caller must ``release()`` the response."""
        ...
