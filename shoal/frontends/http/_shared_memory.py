"""Triton's shared-memory extensions: the bodies of ``/v2/systemsharedmemory/...`` and
``/v2/cudasharedmemory/...``.

* system register: request ``{"key": str, "offset": int (optional, 0), "byte_size": int}``;
  status: a list of ``{"name", "key", "offset", "byte_size"}``;
* CUDA register: request ``{"raw_handle": {"b64": str}, "device_id": int, "byte_size": int}``
  (the base64 of a 64-byte cudaIpcMemHandle_t); status: a list of
  ``{"name", "device_id", "byte_size"}``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from shoal.core import CudaSharedMemoryRegion, InvalidArgument, SharedMemoryRegion
from shoal.frontends.http._document import non_negative_int, optional_object, parse_object


@dataclass(frozen=True)
class RegisterRequest:
    key: str
    offset: int
    byte_size: int


def parse_register_request(body: bytes | bytearray | memoryview) -> RegisterRequest:
    """A register request's fields; ``key`` and ``byte_size`` are required (Triton's messages)."""
    document = parse_object(body)
    for required in ("key", "byte_size"):
        if required not in document:
            raise InvalidArgument(f"Shared memory register request has no '{required}' field")
    key = document["key"]
    if not isinstance(key, str):
        raise InvalidArgument("Unable to parse 'key': expected a string")
    return RegisterRequest(
        key, non_negative_int(document, "offset"), non_negative_int(document, "byte_size")
    )


def shm_status_json(regions: list[SharedMemoryRegion]) -> list[dict[str, Any]]:
    """The status body."""
    return [
        {
            "name": region.name,
            "key": region.key,
            "offset": region.offset,
            "byte_size": region.byte_size,
        }
        for region in regions
    ]


@dataclass(frozen=True)
class CudaRegisterRequest:
    raw_handle: bytes
    device_id: int
    byte_size: int


def parse_cuda_register_request(body: bytes | bytearray | memoryview) -> CudaRegisterRequest:
    """A CUDA register request's fields; the handle arrives base64-encoded under ``b64``."""
    document = parse_object(body)
    for required in ("raw_handle", "device_id", "byte_size"):
        if required not in document:
            raise InvalidArgument(f"Shared memory register request has no '{required}' field")
    encoded = optional_object(document, "raw_handle").get("b64")
    if not isinstance(encoded, str):
        raise InvalidArgument("Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}")
    try:
        raw_handle = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("Unable to parse 'raw_handle': 'b64' is not base64") from None
    return CudaRegisterRequest(
        raw_handle, non_negative_int(document, "device_id"), non_negative_int(document, "byte_size")
    )


def cuda_shm_status_json(regions: list[CudaSharedMemoryRegion]) -> list[dict[str, Any]]:
    """The CUDA status body."""
    return [
        {"name": region.name, "device_id": region.device_id, "byte_size": region.byte_size}
        for region in regions
    ]
