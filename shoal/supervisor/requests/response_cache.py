"""The response cache (``--cache-config local,size=N``): responses of deterministic models kept by
a hash of the request, as Triton's local cache does.

The key is a 128-bit BLAKE2b digest of the model name, the version, every input (name, datatype,
shape, bytes, by name) and the names of the requested outputs (Triton hashes the first three; the
outputs are added so that a request asking for fewer outputs never receives a response made for
more). An entry holds copies of the output bytes in the server's own memory, never blocks of a
stub's output arena: a cached response pins no shared memory, and an evicted or unloaded model's
entries cost nothing more than their bytes. The cache is bounded by ``size``: the least recently
used entries go first, and an entry larger than the whole cache is not kept.
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.core.types import InferInput, InferOutput, InferRequest, InferResponse, ParamValue
from shoal.ipc.dtypes import serialize_bytes
from shoal.supervisor.requests.client_shm import REGION

#: What an entry costs beyond its output bytes (the key, names, shapes, bookkeeping), so that a
#: cache of tiny responses is bounded too.
ENTRY_OVERHEAD = 256
OUTPUT_OVERHEAD = 64


@dataclass(frozen=True)
class CachedOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes
    parameters: tuple[tuple[str, ParamValue], ...]


@dataclass(frozen=True)
class CachedResponse:
    outputs: tuple[CachedOutput, ...]
    parameters: tuple[tuple[str, ParamValue], ...]
    nbytes: int

    def response(self, model: str, version: str, request_id: str) -> InferResponse:
        """A response for one request: views of the cached bytes, nothing to release."""
        outputs = [
            InferOutput(o.name, o.datatype, o.shape, memoryview(o.data), dict(o.parameters))
            for o in self.outputs
        ]
        return InferResponse(model, version, request_id, outputs, dict(self.parameters))


def request_key(request: InferRequest, model: str, version: int) -> bytes | None:
    """The cache key of ``request``, or None when it cannot be hashed (an input in GPU memory:
    a CUDA shared-memory region, as Triton hashes only CPU inputs)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{model}\0{version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        view = _input_view(tensor)
        if view.nbytes == 0 and REGION in tensor.parameters:
            return None  # a CUDA region: its bytes are not here
        _hash_input(digest, tensor, view)
    for name in sorted(o.name for o in request.outputs):
        digest.update(f"out\0{name}\0".encode())
    return digest.digest()


def _input_view(tensor: InferInput) -> memoryview:
    data = tensor.data
    if isinstance(data, np.ndarray):
        data = serialize_bytes(data) if data.dtype == np.object_ else data.tobytes()
    return memoryview(data)


def _hash_input(digest: Any, tensor: InferInput, view: memoryview) -> None:
    shape = ",".join(map(str, tensor.shape))
    digest.update(f"{tensor.name}\0{tensor.datatype}\0{shape}\0{view.nbytes}\0".encode())
    digest.update(view.cast("B") if view.ndim != 1 or view.format != "B" else view)


def copy_response(response: InferResponse) -> CachedResponse | None:
    """A copy of ``response`` to keep, or None when an output has no bytes here (written
    straight into a client's shared-memory region)."""
    outputs = []
    nbytes = ENTRY_OVERHEAD
    for output in response.outputs:
        if REGION in output.parameters:
            return None
        data = bytes(output.data)
        outputs.append(
            CachedOutput(
                output.name,
                output.datatype,
                tuple(output.shape),
                data,
                tuple(output.parameters.items()),
            )
        )
        nbytes += len(data) + OUTPUT_OVERHEAD
    return CachedResponse(tuple(outputs), tuple(response.parameters.items()), nbytes)


class ResponseCache:
    """A byte-bounded LRU map from request keys to responses."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._entries: collections.OrderedDict[bytes, CachedResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, entry: CachedResponse) -> bool:
        """Keep ``entry``, evicting the least recently used ones to make room; False when it is
        larger than the whole cache (not kept)."""
        if entry.nbytes > self.limit_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old.nbytes
        while self.used_bytes + entry.nbytes > self.limit_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = entry
        self.used_bytes += entry.nbytes
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0


__all__ = ["CachedResponse", "ResponseCache", "copy_response", "request_key"]
