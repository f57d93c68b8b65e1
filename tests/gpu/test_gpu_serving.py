"""GPU models served end to end: GPU outputs through DLPack, a BLS chain and an ensemble passing
a 256 MiB CUDA tensor through the supervisor's CUDA pool, and inputs/outputs in clients' CUDA
shared memory via tritonclient.

"Zero copies between stubs" is checked through the pool's own counters (``/metrics``): each GPU
tensor copied into the pool is one allocation, so a chain that hands one tensor from model to
model makes exactly one; and every block comes back once the response is out.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.gpu.conftest import GPU_MODELS
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(300)
COUNT = 64 << 20  # float32: 256 MiB


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, GPU_MODELS, timeout=120.0, metrics=True) as srv:
        yield srv


def _pool(server: ShoalServer) -> tuple[int, int]:
    """(blocks handed out so far, bytes in use) of device 0's CUDA pool."""
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text

    def sample(name: str) -> int:
        found = re.search(rf'^{name}{{device="0"}} (\S+)$', text, re.MULTILINE)
        return int(float(found.group(1))) if found else 0

    return sample("shoal_cuda_pool_allocations_total"), sample("shoal_cuda_pool_used_bytes")


@pytest.fixture
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        yield triton


def _inputs_for(module, fill: float, count: int) -> list:
    inputs = [module.InferInput("FILL", [1], "FP32"), module.InferInput("COUNT", [1], "INT64")]
    inputs[0].set_data_from_numpy(np.array([fill], dtype=np.float32))
    inputs[1].set_data_from_numpy(np.array([count], dtype=np.int64))
    return inputs


def _inputs(fill: float, count: int) -> list[grpcclient.InferInput]:
    return _inputs_for(grpcclient, fill, count)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_gpu_output_reaches_the_client(server, protocol) -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    with module.InferenceServerClient(url) as triton:
        result = triton.infer("gpu_make", _inputs_for(module, 1.5, 1000))
    np.testing.assert_array_equal(result.as_numpy("BIG"), np.full(1000, 1.5, dtype=np.float32))
    assert _pool(server)[1] == 0, "the pool block went back once the response was out"


def test_a_bls_chain_passes_a_256_mib_cuda_tensor_without_copies(server, client) -> None:
    made_before, _ = _pool(server)
    result = client.infer("bls_gpu_chain", _inputs(0.5, COUNT))
    assert result.as_numpy("TOTAL")[0] == 0.5 * COUNT
    assert result.as_numpy("ON_GPU")[0], "the BLS caller got the tensor in GPU memory"
    assert result.as_numpy("SUM_INPUT_ON_GPU")[0], "and handed it on in GPU memory"
    made, in_use = _pool(server)
    # gpu_make's output went into the pool once; the caller and gpu_sum used that block.
    assert made - made_before == 1
    assert in_use == 0


def test_an_ensemble_passes_a_256_mib_cuda_tensor_without_copies(server, client) -> None:
    made_before, _ = _pool(server)
    result = client.infer("ens_gpu_chain", _inputs(2.0, COUNT))
    assert result.as_numpy("TOTAL")[0] == 2.0 * COUNT
    assert result.as_numpy("INPUT_ON_GPU")[0], "the second step got the tensor in GPU memory"
    made, in_use = _pool(server)
    assert made - made_before == 1
    assert in_use == 0


def test_a_model_that_forces_cpu_inputs_gets_a_gpu_tensor_on_the_cpu(server, client) -> None:
    result = client.infer("ens_gpu_to_cpu", _inputs(3.0, 1 << 20))
    assert result.as_numpy("TOTAL")[0] == 3.0 * (1 << 20)
    assert _pool(server)[1] == 0


def test_an_exhausted_pool_fails_the_response_and_names_the_flag() -> None:
    small = ("--cuda-memory-pool-byte-size", "0:1048576")
    with (
        ShoalServer(BUNDLED, GPU_MODELS, timeout=120.0, extra_args=small) as srv,
        grpcclient.InferenceServerClient(srv.grpc_url) as triton,
    ):
        with pytest.raises(Exception, match="--cuda-memory-pool-byte-size 0:") as raised:
            triton.infer("gpu_make", _inputs(1.0, 1 << 20))  # 4 MiB
        assert "exhausted" in str(raised.value)
        result = triton.infer("gpu_make", _inputs(1.0, 1000))  # fits: the pool still works
        np.testing.assert_array_equal(result.as_numpy("BIG"), np.ones(1000, np.float32))


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
                # Bytes for both clients, as Triton's examples pass them (the HTTP client's
                # rapidjson writes them as text).
                triton.register_cuda_shared_memory(name, raw, 0, 128)
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


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_gpu_models_use_cuda_shared_memory_in_place(server, protocol) -> None:
    """gpu_sum reads BIG where the client put it (a GPU tensor, not a copy); gpu_make writes BIG
    straight into the client's region (no pool block); both through the stub, by descriptor."""
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    count = 1 << 20
    big = np.arange(count, dtype=np.float32) % 7
    regions = {
        "big_in": cudashm.create_shared_memory_region(f"big_in_{protocol}", big.nbytes, 0),
        "sum_out": cudashm.create_shared_memory_region(f"sum_out_{protocol}", 16, 0),
        "big_out": cudashm.create_shared_memory_region(f"big_out_{protocol}", big.nbytes, 0),
    }
    with module.InferenceServerClient(url) as triton:
        try:
            cudashm.set_shared_memory_region(regions["big_in"], [big])
            for name, region in regions.items():
                raw = cudashm.get_raw_handle(region)
                size = big.nbytes if name.startswith("big") else 16
                triton.register_cuda_shared_memory(name, raw, 0, size)
            made_before, _ = _pool(server)

            summed_input = module.InferInput("BIG", [count], "FP32")
            summed_input.set_shared_memory("big_in", big.nbytes)
            total = module.InferRequestedOutput("TOTAL")
            total.set_shared_memory("sum_out", 8)
            where = module.InferRequestedOutput("INPUT_ON_GPU")
            where.set_shared_memory("sum_out", 1, offset=8)
            triton.infer("gpu_sum", [summed_input], outputs=[total, where])
            got = cudashm.get_contents_as_numpy(regions["sum_out"], np.uint8, [16])
            assert got[:8].view(np.float64)[0] == float(big.sum(dtype=np.float64))
            assert got[8] == 1, "gpu_sum saw BIG in GPU memory"

            made = module.InferRequestedOutput("BIG")
            made.set_shared_memory("big_out", big.nbytes)
            triton.infer("gpu_make", _inputs_for(module, 2.5, count), outputs=[made])
            out = cudashm.get_contents_as_numpy(regions["big_out"], np.float32, [count])
            np.testing.assert_array_equal(out, np.full(count, 2.5, dtype=np.float32))
            assert _pool(server) == (made_before, 0), "written in place: no pool block"
        finally:
            triton.unregister_cuda_shared_memory()
            for region in regions.values():
                cudashm.destroy_shared_memory_region(region)


def test_a_stub_that_dies_gives_back_the_pool_blocks_it_held(server, client) -> None:
    count = 1 << 22  # 16 MiB
    inputs = [grpcclient.InferInput("COUNT", [1], "INT64")]
    inputs[0].set_data_from_numpy(np.array([count], dtype=np.int64))
    made_before, _ = _pool(server)
    with pytest.raises(Exception, match="exit code 3"):
        client.infer("bls_gpu_crash", inputs)
    made, in_use = _pool(server)
    assert made - made_before == 1, "the BLS input went into the pool"
    assert in_use == 0, "the dead stub's block came back"


def test_implicit_state_kept_from_a_gpu_output(client) -> None:
    totals = []
    for step, value in enumerate((1.5, 2.0, 4.0)):
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
        result = client.infer(
            "gpu_accumulate",
            [tensor],
            sequence_id=42,
            sequence_start=step == 0,
            sequence_end=step == 2,
        )
        totals.append(float(result.as_numpy("OUT")[0]))
    assert totals == [1.5, 3.5, 7.5]


def test_a_disabled_pool_sends_gpu_tensors_through_the_host() -> None:
    """``--cuda-memory-pool-byte-size 0:0`` (tritonserver's way to turn its pool off): GPU
    tensors still reach the next model and the client, through host memory."""
    off = ("--cuda-memory-pool-byte-size", "0:0")
    with (
        ShoalServer(BUNDLED, GPU_MODELS, timeout=120.0, extra_args=off, metrics=True) as srv,
        grpcclient.InferenceServerClient(srv.grpc_url) as triton,
    ):
        result = triton.infer("ens_gpu_chain", _inputs(2.0, 1 << 20))
        assert result.as_numpy("TOTAL")[0] == 2.0 * (1 << 20)
        made = triton.infer("gpu_make", _inputs(1.5, 1000)).as_numpy("BIG")
        np.testing.assert_array_equal(made, np.full(1000, 1.5, dtype=np.float32))
        assert _pool(srv) == (0, 0), "no pool was made"


def test_a_cuda_region_registered_again_is_read_again(server) -> None:
    """Unregister and register the same allocation: the stub, which opened the handle once,
    keeps reading it (CUDA opens a handle once per process)."""
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    big = np.ones(1024, dtype=np.float32)
    region = cudashm.create_shared_memory_region("again_in", big.nbytes, 0)
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        try:
            cudashm.set_shared_memory_region(region, [big])
            for scale in (1, 2):
                triton.register_cuda_shared_memory(
                    "again_in", cudashm.get_raw_handle(region), 0, big.nbytes
                )
                cudashm.set_shared_memory_region(region, [big * scale])
                tensor = grpcclient.InferInput("BIG", [1024], "FP32")
                tensor.set_shared_memory("again_in", big.nbytes)
                total = triton.infer("gpu_sum", [tensor]).as_numpy("TOTAL")[0]
                assert total == 1024 * scale
                triton.unregister_cuda_shared_memory("again_in")
        finally:
            triton.unregister_cuda_shared_memory()
            cudashm.destroy_shared_memory_region(region)
