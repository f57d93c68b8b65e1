"""The response cache's key, its byte bound and its LRU eviction; the cache flags."""

from __future__ import annotations

import numpy as np
import pytest

from shoal import _serve_flags
from shoal.core.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)
from shoal.supervisor.requests.response_cache import (
    ENTRY_OVERHEAD,
    OUTPUT_OVERHEAD,
    ResponseCache,
    copy_response,
    request_key,
)


def _request(data, datatype="FP32", shape=(2,), outputs=(), name="IN") -> InferRequest:
    return InferRequest(
        "m",
        inputs=[InferInput(name, datatype, shape, data)],
        outputs=[RequestedOutput(o) for o in outputs],
    )


def _response(nbytes: int) -> InferResponse:
    return InferResponse(
        "m", "1", outputs=[InferOutput("OUT", "UINT8", (nbytes,), memoryview(bytes(nbytes)))]
    )


def test_the_key_covers_model_version_inputs_and_requested_outputs():
    raw = np.array([1, 2], dtype=np.float32)
    key = request_key(_request(memoryview(raw.tobytes())), "m", 1)
    assert key == request_key(_request(raw), "m", 1)  # JSON (an array) and binary agree
    assert key != request_key(_request(raw), "m", 2)
    assert key != request_key(_request(raw), "other", 1)
    assert key != request_key(_request(raw, shape=(1, 2)), "m", 1)
    assert key != request_key(_request(raw.view(np.int32), "INT32"), "m", 1)
    assert key != request_key(_request(raw, name="IN2"), "m", 1)
    assert key != request_key(_request(raw, outputs=("OUT",)), "m", 1)
    strings = np.array([b"a", b"bc"], dtype=np.object_)
    serialized = b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
    assert request_key(_request(strings, "BYTES"), "m", 1) == request_key(
        _request(serialized, "BYTES"), "m", 1
    )


def test_an_input_in_gpu_memory_is_not_hashed():
    request = _request(memoryview(b""))
    request.inputs[0].parameters["shared_memory_region"] = "gpu"
    assert request_key(request, "m", 1) is None


def test_entries_are_copies_and_the_cache_evicts_least_recently_used():
    size = 100
    entry_bytes = ENTRY_OVERHEAD + OUTPUT_OVERHEAD + size
    cache = ResponseCache(limit_bytes=2 * entry_bytes)
    backing = bytearray(size)
    response = InferResponse(
        "m", "1", outputs=[InferOutput("OUT", "UINT8", (size,), memoryview(backing))]
    )
    entry = copy_response(response)
    assert entry is not None and entry.nbytes == entry_bytes
    backing[0] = 7  # the arena block is reused: the cached copy does not change
    assert entry.outputs[0].data[0] == 0
    assert cache.put(b"a", entry) and cache.put(b"b", copy_response(_response(size)))
    assert cache.get(b"a") is entry  # a is now the most recent
    assert cache.put(b"c", copy_response(_response(size)))
    assert cache.get(b"b") is None and cache.get(b"a") is entry and cache.get(b"c") is not None
    assert cache.used_bytes == 2 * entry_bytes and cache.evictions == 1 and len(cache) == 2
    assert not cache.put(b"big", copy_response(_response(3 * size + 2 * ENTRY_OVERHEAD)))
    assert len(cache) == 2
    served = entry.response("m", "1", "id-1")
    assert served.id == "id-1" and bytes(served.outputs[0].data) == bytes(size)


def test_a_response_written_into_client_shared_memory_is_not_kept():
    response = _response(4)
    response.outputs[0].parameters["shared_memory_region"] = "region"
    assert copy_response(response) is None


@pytest.mark.parametrize(
    ("settings", "byte_size", "message"),
    [
        ([("local", "size", "1"), ("redis", "host", "x")], None, "multiple cache configurations"),
        ([("local", "size", "1")], 5, "incompatible flags"),
        ([("redis", "host", "x")], None, "cache 'redis' is not available"),
        ([("local", "size", "lots")], None, "needs a number of bytes"),
        ([("local", "size", "0")], None, "more than 0 bytes"),
        ([("local", "ttl", "1")], None, "no setting ttl"),
    ],
)
def test_cache_flag_misuse_is_refused(settings, byte_size, message):
    with pytest.raises(SystemExit, match=message):
        _serve_flags.cache_bytes(settings, byte_size)


def test_cache_flags():
    assert _serve_flags.cache_bytes([("local", "size", "1048576")], None) == 1048576
    assert _serve_flags.cache_bytes([], 4096) == 4096
    assert _serve_flags.cache_bytes([], None) == 0
