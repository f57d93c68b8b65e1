"""gRPC status codes, and the one table that maps core error codes to them (no grpcio import).

Both servers use it: the native one writes the number into ``grpc-status``; the grpcio one
converts it to ``grpc.StatusCode`` of the same name.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from shoal.core import ErrorCode

__all__ = ["GRPC_STATUS", "Status"]


class Status(enum.IntEnum):
    """gRPC's status codes (the numbers of ``grpc-status``), named as ``grpc.StatusCode``."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


#: gRPC status of each core error code, as Triton's (TRITONSERVER_Error_Code -> grpc::StatusCode).
GRPC_STATUS: Mapping[ErrorCode, Status] = {
    ErrorCode.UNKNOWN: Status.UNKNOWN,
    ErrorCode.INTERNAL: Status.INTERNAL,
    ErrorCode.NOT_FOUND: Status.NOT_FOUND,
    ErrorCode.INVALID_ARG: Status.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: Status.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: Status.ALREADY_EXISTS,
    ErrorCode.CANCELLED: Status.CANCELLED,
    ErrorCode.RESOURCE_EXHAUSTED: Status.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: Status.DEADLINE_EXCEEDED,
    ErrorCode.PERMISSION_DENIED: Status.PERMISSION_DENIED,
}
