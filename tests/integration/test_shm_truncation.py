"""A client that shrinks its shared-memory object after registering it gets 400, and the server
and its stubs live on (it used to kill the supervisor with SIGBUS)."""

from __future__ import annotations

import os
import time

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

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


def test_object_shrunk_while_the_model_holds_the_input():
    """The race the size checks cannot close: the client shrinks its object after the request
    started, while the model holds the input and before it reads it. The stub read the window
    into memory of its own when the request started, so the model reads what the client had
    sent and the stub lives on (a mapping of the client's object would have killed it with
    SIGBUS)."""
    key = f"/shoal_test_held_{os.getpid()}"
    values = np.arange(1 << 18, dtype=np.float32)  # 1 MiB, many pages
    handle = shm.create_shared_memory_region("held", key, values.nbytes)
    args = ("--model-control-mode", "explicit", "--load-model", "shm_holder")
    try:
        with ShoalServer(TEST_MODELS, extra_args=args) as server:
            shm.set_shared_memory_region(handle, [values])
            client = httpclient.InferenceServerClient(server.url)
            try:
                client.register_system_shared_memory("held", key, values.nbytes)
                stubs = server.stub_pids()
                data = httpclient.InferInput("DATA", [values.size], "FP32")
                data.set_shared_memory("held", values.nbytes)
                seconds = httpclient.InferInput("SECONDS", [1], "FP32")
                seconds.set_data_from_numpy(np.array([0.5], dtype=np.float32))
                pending = client.async_infer("shm_holder", [data, seconds])
                deadline = time.monotonic() + 30
                while "shm_holder: holding the input" not in server.output:
                    assert time.monotonic() < deadline, server.output
                    # gevent's sleep: async_infer's request goes out from a greenlet, which
                    # runs only while this thread yields to gevent.
                    gevent.sleep(0.01)  # polling the server's log
                os.truncate(f"/dev/shm{key}", 0)
                result = pending.get_result()
                assert result.as_numpy("SUM")[0] == values.sum(dtype=np.float64)
                assert server.proc.poll() is None and server.stub_pids() == stubs, server.output
                client.unregister_system_shared_memory()
            finally:
                client.close()
    finally:
        shm.destroy_shared_memory_region(handle)
