"""GPU models served end to end: GPU outputs through DLPack, a BLS chain and an ensemble passing
a 256 MiB CUDA tensor, and inputs/outputs in clients' CUDA shared memory via tritonclient."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.gpu.conftest import GPU_MODELS
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(300)
COUNT = 64 << 20  # float32: 256 MiB


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, GPU_MODELS, timeout=120.0) as srv:
        yield srv


@pytest.fixture
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        yield triton


def _inputs(fill: float, count: int) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("FILL", [1], "FP32"),
        grpcclient.InferInput("COUNT", [1], "INT64"),
    ]
    inputs[0].set_data_from_numpy(np.array([fill], dtype=np.float32))
    inputs[1].set_data_from_numpy(np.array([count], dtype=np.int64))
    return inputs


def test_a_gpu_output_reaches_the_client(client) -> None:
    result = client.infer("gpu_make", _inputs(1.5, 1000))
    np.testing.assert_array_equal(result.as_numpy("BIG"), np.full(1000, 1.5, dtype=np.float32))


def test_a_bls_chain_passes_a_256_mib_cuda_tensor(client) -> None:
    result = client.infer("bls_gpu_chain", _inputs(0.5, COUNT))
    assert result.as_numpy("TOTAL")[0] == 0.5 * COUNT
    assert result.as_numpy("ON_GPU")[0], "preferred_memory GPU gives the caller a GPU tensor"


def test_an_ensemble_passes_a_256_mib_cuda_tensor(client) -> None:
    result = client.infer("ens_gpu_chain", _inputs(2.0, COUNT))
    assert result.as_numpy("TOTAL")[0] == 2.0 * COUNT


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_cuda_shared_memory(server, protocol) -> None:
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 3, dtype=np.float32)
    inputs_region = cudashm.create_shared_memory_region("gpu_in", 128, 0)
    outputs_region = cudashm.create_shared_memory_region("gpu_out", 128, 0)
    with module.InferenceServerClient(url) as triton:
        try:
            cudashm.set_shared_memory_region(inputs_region, [a, b])
            for name, region in (("gpu_in", inputs_region), ("gpu_out", outputs_region)):
                raw = cudashm.get_raw_handle(region)
                triton.register_cuda_shared_memory(
                    name, raw.decode() if protocol == "http" else raw, 0, 128
                )
            inputs = [module.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("gpu_in", 16, offset=0)
            inputs[1].set_shared_memory("gpu_in", 16, offset=16)
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            outputs[0].set_shared_memory("gpu_out", 16, offset=0)
            outputs[1].set_shared_memory("gpu_out", 16, offset=16)
            triton.infer("add_sub", inputs, outputs=outputs)
            got = cudashm.get_contents_as_numpy(outputs_region, np.float32, [8])
            np.testing.assert_array_equal(got[:4], a + b)
            np.testing.assert_array_equal(got[4:], a - b)
            status = triton.get_cuda_shared_memory_status()
            names = (
                {r["name"] for r in status}
                if isinstance(status, list)
                else {r.name for r in status.regions.values()}
            )
            assert names == {"gpu_in", "gpu_out"}
        finally:
            triton.unregister_cuda_shared_memory()
            cudashm.destroy_shared_memory_region(inputs_region)
            cudashm.destroy_shared_memory_region(outputs_region)
