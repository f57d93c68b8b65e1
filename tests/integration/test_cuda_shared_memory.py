"""Triton's CUDA shared-memory extension through tritonclient, on a machine without GPUs.

A tritonserver built without GPU support answers a register with INVALID_ARG "GPUs not
supported" and lists no regions; shoal does the same on both protocols. The GPU side (a real
handle from tritonclient.utils.cuda_shared_memory) is in tests/gpu/.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.ipc.cuda import cuda_device_count
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(cuda_device_count() > 0, reason="this machine has a GPU: see tests/gpu/"),
]

RAW_HANDLE = base64.b64encode(bytes(64))  # what cuda_shared_memory.get_raw_handle returns


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED) as srv:
        yield srv


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        triton = httpclient.InferenceServerClient(server.url)
    else:
        triton = grpcclient.InferenceServerClient(server.grpc_url)
    yield triton
    triton.close()


def _regions(status) -> list:
    return status if isinstance(status, list) else list(status.regions.values())


def test_register_fails_as_a_tritonserver_without_gpus(client) -> None:
    # tritonclient.http puts raw_handle into JSON as given: callers pass the base64 text.
    handle = (
        RAW_HANDLE.decode() if isinstance(client, httpclient.InferenceServerClient) else RAW_HANDLE
    )
    with pytest.raises(InferenceServerException) as caught:
        client.register_cuda_shared_memory("gpu_in", handle, 0, 64)
    assert "failed to register CUDA shared memory region: 'gpu_in', GPUs not supported" in str(
        caught.value
    )
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_status_and_unregister_work_and_see_no_regions(client) -> None:
    assert _regions(client.get_cuda_shared_memory_status()) == []
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory region"):
        client.get_cuda_shared_memory_status("gpu_in")
    client.unregister_cuda_shared_memory("gpu_in")
    client.unregister_cuda_shared_memory()


def test_an_input_in_an_unregistered_region_names_it(client) -> None:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = [module.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory("gpu_in", 16)
    inputs[1].set_data_from_numpy(np.zeros(4, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="'gpu_in'"):
        client.infer("add_sub", inputs)
