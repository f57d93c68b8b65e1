"""A request answered from the response cache, and a miss's response kept in it."""

from __future__ import annotations

import logging
import time

from shoal.core.types import InferRequest, InferResponse
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.requests import classification
from shoal.supervisor.requests.client_shm import write_shm_outputs
from shoal.supervisor.requests.response_cache import CachedResponse, ResponseCache, copy_response

log = logging.getLogger("shoal")


def cache_hit(
    shm: SharedMemoryRegistry,
    mv: ModelVersion,
    request: InferRequest,
    cached: CachedResponse,
    classes: dict[str, int],
    started: int,
    lookup_started: int,
) -> InferResponse:
    """Answer from the response cache: the model does not run (Triton's statistics: a success
    and a cache hit, no inference or execution)."""
    response = cached.response(mv.name, str(mv.version), request.id)
    if classes:
        classification.classify(response, mv.config, classes)
    write_shm_outputs(shm, request, response)
    finished = time.monotonic_ns()
    mv.stats.cache_hit(finished - started, lookup_started - started, finished - lookup_started)
    return response


def cache_insert(
    cache: ResponseCache | None,
    mv: ModelVersion,
    key: bytes,
    response: InferResponse,
    lookup_ns: int,
) -> None:
    """Keep a copy of a miss's response; the lookup and this copy are its cache-miss time."""
    assert cache is not None
    inserting = time.monotonic_ns()
    entry = copy_response(response)
    if entry is not None and not cache.put(key, entry):
        log.warning(
            "model '%s': a response of %d bytes is larger than the response cache (%d bytes): "
            "not cached",
            mv.name,
            entry.nbytes,
            cache.limit_bytes,
        )
    mv.stats.cache_miss(lookup_ns + time.monotonic_ns() - inserting)
