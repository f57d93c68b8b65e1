"""Triton's system shared-memory extension: the bodies of ``/v2/systemsharedmemory/...``.

* register: request ``{"key": str, "offset": int (optional, 0), "byte_size": int}``;
* status: response a list of ``{"name", "key", "offset", "byte_size"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.frontends._document import non_negative_int, parse_object
from shoal.supervisor.core import InvalidArgument, SharedMemoryRegion


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
