"""The one error hierarchy of shoal's core.

Every error carries a transport-neutral :class:`ErrorCode`; each frontend maps codes to its own
statuses in one table. Messages name the model, the tensor and what was expected.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Neutral error codes, matching TRITONSERVER_Error_Code's meanings."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    PERMISSION_DENIED = "PERMISSION_DENIED"


class ShoalError(Exception):
    """Base of every error the core reports to a client. Recoverable: it fails one call.

    ``reason`` is the ``reason`` label of Triton's ``nv_inference_request_failure`` metric under
    which a failed request is counted: ``REJECTED``, ``CANCELED``, ``BACKEND`` or ``OTHER``.
    """

    code: ErrorCode = ErrorCode.INTERNAL
    reason: str = "OTHER"

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ShoalError):
    """The request is malformed: bad JSON, wrong shape, datatype or byte size, unknown tensor."""

    code = ErrorCode.INVALID_ARG


class NotFound(ShoalError):
    """The model, version or shared-memory region named by the request does not exist."""

    code = ErrorCode.NOT_FOUND


class Unavailable(ShoalError):
    """The model exists but cannot serve now: not ready, stub died, server shutting down."""

    code = ErrorCode.UNAVAILABLE


class Rejected(Unavailable):
    """A scheduler refused or dropped a queued request: its queue was full, or its queue
    timeout expired."""

    reason = "REJECTED"


class ModelError(ShoalError):
    """The model answered a request with an error (``TritonError`` in the response, an
    exception from ``execute``); ``code`` is the model's."""

    reason = "BACKEND"


class Unsupported(ShoalError):
    """The request asks for something shoal does not implement (yet)."""

    code = ErrorCode.UNSUPPORTED


class DecoupledInfer(Unsupported):
    """A one-response inference call to a decoupled model. The message is Triton's gRPC one;
    the HTTP frontend answers ``http_message``, Triton's HTTP one."""

    def __init__(self, model: str) -> None:
        reason = (
            f"model '{model}' is decoupled (model_transaction_policy decoupled: true), so it "
            "may send any number of responses"
        )
        super().__init__(
            "ModelInfer RPC doesn't support models with decoupled transaction policy: "
            f"{reason}; use ModelStreamInfer"
        )
        self.http_message = (
            "HTTP end point doesn't support models with decoupled transaction policy: "
            f"{reason}; use the generate_stream endpoint or gRPC ModelStreamInfer"
        )


class ResourceExhausted(ShoalError):
    """Shared memory or a queue is full; the message states requested and available amounts."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class InternalError(ShoalError):
    """A bug or an unexpected failure inside shoal or the model."""

    code = ErrorCode.INTERNAL


class Cancelled(ShoalError):
    """The request was cancelled by the client or by shutdown."""

    code = ErrorCode.CANCELLED
    reason = "CANCELED"


class DeadlineExceeded(ShoalError):
    """The request's timeout expired before it completed."""

    code = ErrorCode.DEADLINE_EXCEEDED
