"""A client that shrinks its shared-memory object after registering it gets 400, and the server
and its stubs live on (it used to kill the supervisor with SIGBUS)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

KEY = f"/shoal_test_truncated_{os.getpid()}"


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED) as srv:
        yield srv


@pytest.fixture
def client(server):
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def region():
    """A 64-byte object ``KEY``, removed afterwards whatever the test did to it."""
    handle = shm.create_shared_memory_region("r", KEY, 64)
    yield handle
    shm.destroy_shared_memory_region(handle)


def _shrink(size: int) -> None:
    os.truncate(f"/dev/shm{KEY}", size)


def _still_serving(server: ShoalServer, client, stubs: set[int]) -> None:
    assert server.proc.poll() is None, server.output
    assert server.stub_pids() == stubs, "a stub died"
    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"ok"]], dtype=object))
    answer = client.infer("string_upper", [text])
    assert answer.as_numpy("UPPER")[0][0] == b"OK"


def _expect_400(call, *words: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == "400", info.value
    for word in words:
        assert word in info.value.message(), info.value


def test_bytes_input_from_a_shrunk_object(server, client, region):
    data = serialize_byte_tensor(np.array([b"hello", b"world"], dtype=object))
    shm.set_shared_memory_region(region, [data])
    client.register_system_shared_memory("r", KEY, 64)
    stubs = server.stub_pids()
    text = httpclient.InferInput("TEXT", [1, 2], "BYTES")
    text.set_shared_memory("r", len(data.item()))  # 2 x (4-byte length + 5 bytes)
    assert list(client.infer("string_upper", [text]).as_numpy("UPPER")[0]) == [b"HELLO", b"WORLD"]
    for size in (0, 8):  # all gone; the first element's length and part of its bytes left
        _shrink(size)
        _expect_400(lambda: client.infer("string_upper", [text]), "'r'", "shrunk")
        _still_serving(server, client, stubs)


def test_tensor_input_from_a_shrunk_object(server, client, region):
    """Read by the stub in place: the stub checks the object too, and only the request fails."""
    values = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(region, [values])
    client.register_system_shared_memory("r", KEY, 64)
    stubs = server.stub_pids()
    tensor = httpclient.InferInput("IN_FP32", [16], "FP32")
    tensor.set_shared_memory("r", 64)
    out = httpclient.InferRequestedOutput("OUT_FP32", binary_data=True)
    answer = client.infer("identity", [tensor], outputs=[out])
    np.testing.assert_array_equal(answer.as_numpy("OUT_FP32"), values)
    _shrink(32)
    _expect_400(lambda: client.infer("identity", [tensor], outputs=[out]), "'r'", "shrunk")
    _still_serving(server, client, stubs)


def test_output_into_a_shrunk_object(server, client, region):
    client.register_system_shared_memory("r", KEY, 64)
    stubs = server.stub_pids()
    tensor = httpclient.InferInput("IN_FP32", [16], "FP32")
    tensor.set_data_from_numpy(np.arange(16, dtype=np.float32))
    out = httpclient.InferRequestedOutput("OUT_FP32")
    out.set_shared_memory("r", 64)
    client.infer("identity", [tensor], outputs=[out])
    _shrink(0)
    _expect_400(lambda: client.infer("identity", [tensor], outputs=[out]), "'r'", "shrunk")
    _still_serving(server, client, stubs)


def test_registering_an_empty_object_or_window_is_a_client_error(server, client, region):
    _expect_400(lambda: client.register_system_shared_memory("r", KEY, 0), "byte_size")
    _shrink(0)
    _expect_400(lambda: client.register_system_shared_memory("r", KEY, 0), "byte_size")
    _expect_400(lambda: client.register_system_shared_memory("r", KEY, 16), "exceeds")
    assert client.get_system_shared_memory_status() == []
    _still_serving(server, client, server.stub_pids())
