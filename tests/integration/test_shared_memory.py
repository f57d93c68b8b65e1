"""Triton's system shared-memory extension with tritonclient's own shm utilities."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED) as srv:
        yield srv


@pytest.fixture(params=["http", "grpc"])
def protocol(request, server):
    if request.param == "http":
        client = httpclient.InferenceServerClient(server.url)
        yield httpclient, client
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        yield grpcclient, client
    client.unregister_system_shared_memory()
    client.close()


def test_inputs_and_outputs_in_client_shared_memory(protocol):
    module, client = protocol
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10, dtype=np.float32)
    key = f"/shoal_test_{module.__name__.split('.')[-1]}"
    inputs_handle = shm.create_shared_memory_region("in", key + "_in", 32)
    outputs_handle = shm.create_shared_memory_region("out", key + "_out", 32)
    try:
        shm.set_shared_memory_region(inputs_handle, [a, b])
        client.register_system_shared_memory("in", key + "_in", 32)
        client.register_system_shared_memory("out", key + "_out", 32)
        status = client.get_system_shared_memory_status()
        names = (
            {r["name"] for r in status}
            if isinstance(status, list)
            else {r.name for r in status.regions.values()}
        )
        assert names == {"in", "out"}
        inputs = [
            module.InferInput("INPUT0", [4], "FP32"),
            module.InferInput("INPUT1", [4], "FP32"),
        ]
        inputs[0].set_shared_memory("in", 16, offset=0)
        inputs[1].set_shared_memory("in", 16, offset=16)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", 16, offset=0)
        outputs[1].set_shared_memory("out", 16, offset=16)
        result = client.infer("add_sub", inputs, outputs=outputs)
        assert result.get_output("OUTPUT0") is not None  # described, with its data in the region
        total = shm.get_contents_as_numpy(outputs_handle, np.float32, [4], offset=0)
        difference = shm.get_contents_as_numpy(outputs_handle, np.float32, [4], offset=16)
        np.testing.assert_array_equal(total, a + b)
        np.testing.assert_array_equal(difference, a - b)
        # Out-of-bounds windows are refused, and the server stays healthy.
        bad = module.InferInput("INPUT0", [4], "FP32")
        bad.set_shared_memory("in", 16, offset=24)
        with pytest.raises(InferenceServerException):
            client.infer("add_sub", [bad, inputs[1]])
        # An output window too small for the result is refused with both sizes.
        small = module.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("out", 8, offset=0)
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", inputs, outputs=[small])
        # The client's mistake, in Triton's words: not a model failure.
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert info.value.message() == (
            "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
            "should be at least 16 bytes to hold the results"
        )
        client.unregister_system_shared_memory("in")
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", inputs, outputs=outputs)
        assert info.value.status() in ("404", "StatusCode.NOT_FOUND")  # Triton's code
        assert "Unable to find shared memory region: 'in'" in info.value.message()
        assert client.is_server_ready()
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs_handle)
        shm.destroy_shared_memory_region(outputs_handle)


def test_registering_an_unknown_key_fails_clearly(protocol):
    _, client = protocol
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("nope", "/shoal_no_such_region", 64)


def test_allow_client_shm_false_refuses_register_and_unregister_as_triton():
    """``--allow-client-shm=false``: register and unregister answer Triton's UNSUPPORTED error
    on both protocols, the status calls still answer, and no region gets registered."""
    key = f"/shoal_test_disallowed_{os.getpid()}"
    handle = shm.create_shared_memory_region("disallowed", key, 64)
    try:
        with ShoalServer(BUNDLED, extra_args=("--allow-client-shm=false",)) as srv:
            http = httpclient.InferenceServerClient(srv.url)
            grpc = grpcclient.InferenceServerClient(srv.grpc_url)
            calls = [
                lambda: http.register_system_shared_memory("r", key, 64),
                lambda: http.unregister_system_shared_memory("r"),
                lambda: http.unregister_system_shared_memory(),
                lambda: grpc.register_system_shared_memory("r", key, 64),
                lambda: grpc.unregister_system_shared_memory(),
                lambda: http.unregister_cuda_shared_memory(),
                lambda: grpc.unregister_cuda_shared_memory(),
            ]
            for call in calls:
                with pytest.raises(InferenceServerException) as info:
                    call()
                assert "Client shared memory is disabled. Start the server with " in str(
                    info.value
                ), info.value
                assert "'--allow-client-shm=true' to enable." in str(info.value)
            with pytest.raises(InferenceServerException) as info:
                http.register_system_shared_memory("r", key, 64)
            assert info.value.status() == "501"
            assert http.get_system_shared_memory_status() == []
            assert not grpc.get_system_shared_memory_status().regions
            http.close()
            grpc.close()
        with ShoalServer(BUNDLED, extra_args=("--allow-client-shm=true",)) as srv:
            client = httpclient.InferenceServerClient(srv.url)
            client.register_system_shared_memory("r", key, 64)
            assert [r["name"] for r in client.get_system_shared_memory_status()] == ["r"]
            client.unregister_system_shared_memory()
            client.close()
    finally:
        shm.destroy_shared_memory_region(handle)
