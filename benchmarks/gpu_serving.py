"""GPU tensors through a running server: an ensemble and a BLS chain hand a CUDA tensor between
two stubs, against the same work done in one process.

    python -m benchmarks.gpu_serving                      # 4, 64 and 256 MiB; 30 requests each
    python -m benchmarks.gpu_serving --sizes-mib 256 --requests 50

The models are tests/gpu/models: ``gpu_make`` fills a float32 CUDA tensor, ``gpu_sum`` sums it
on the GPU (it takes GPU inputs), ``cpu_sum`` sums it with NumPy (CPU inputs, Triton's default).
Per size, sequential gRPC requests (the client sends two scalars and reads one), median latency:

* ``in-process``: ``cupy.full`` then ``sum`` in this process: the work itself, no server.
* ``ens_gpu_chain``: gpu_make → gpu_sum as an ensemble: the tensor goes into the CUDA pool once
  and gpu_sum reads that block through its IPC handle.
* ``bls_gpu_chain``: a model calls gpu_make, then hands the output on to gpu_sum, both by BLS.
* ``ens_gpu_to_cpu``: gpu_make → cpu_sum: the second stub copies the tensor to the host.

"overhead" is the latency above in-process; "pool blocks" says how many CUDA pool blocks (so
device-to-device copies) one request made. Without cupy or a CUDA device it prints why and
exits 0 (this project's CI has no GPU).
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.batching import machine, start_listening, stop_server
from shoal.ipc.cuda import cuda_device_count, cupy_module

MODELS = Path(__file__).resolve().parent.parent / "tests" / "gpu" / "models"
CHAINS = ("ens_gpu_chain", "bls_gpu_chain", "ens_gpu_to_cpu")


def in_process(count: int, requests: int) -> float:
    cupy = cupy_module()
    times = []
    for _ in range(requests + 3):
        start = time.perf_counter()
        float(cupy.full(count, 1.0, dtype=cupy.float32).sum(dtype=cupy.float64))
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def served(url: str, model: str, count: int, requests: int) -> float:
    import tritonclient.grpc as grpcclient

    inputs = [
        grpcclient.InferInput("FILL", [1], "FP32"),
        grpcclient.InferInput("COUNT", [1], "INT64"),
    ]
    inputs[0].set_data_from_numpy(np.array([1.0], dtype=np.float32))
    inputs[1].set_data_from_numpy(np.array([count], dtype=np.int64))
    times = []
    with grpcclient.InferenceServerClient(url) as client:
        for _ in range(requests + 3):
            start = time.perf_counter()
            result = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput("TOTAL")])
            times.append(time.perf_counter() - start)
            assert result.as_numpy("TOTAL")[0] == count, f"{model} summed wrong"
    return statistics.median(times[3:])


def pool_allocations(metrics_url: str) -> int:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r'^shoal_cuda_pool_allocations_total\{device="0"\} (\S+)$', text, re.M)
    return int(float(found.group(1))) if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64, 256])
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args(argv)
    if cuda_device_count() == 0:
        print("gpu_serving: no CUDA device (or no cupy) here; nothing to measure")
        return 0
    print(machine())
    cupy = cupy_module()
    print(f"GPU: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    with tempfile.TemporaryFile() as log:
        extra = ("--allow-grpc", "true", "--grpc-port", "0")
        extra += ("--allow-metrics", "true", "--metrics-port", "0")
        process, urls = start_listening(MODELS, log, extra)
        try:
            print(f"{'size':>9} {'path':>16} {'p50 ms':>8} {'overhead ms':>12} {'pool blocks':>12}")
            for mib in args.sizes_mib:
                count = mib * (1 << 20) // 4
                base = in_process(count, args.requests)
                print(f"{mib:>5} MiB {'in-process':>16} {base * 1e3:>8.2f}")
                for model in CHAINS:
                    before = pool_allocations(urls["metrics"])
                    p50 = served(urls["grpc"], model, count, args.requests)
                    made = (pool_allocations(urls["metrics"]) - before) / (args.requests + 3)
                    overhead = (p50 - base) * 1e3
                    line = f"{mib:>5} MiB {model:>16} {p50 * 1e3:>8.2f} {overhead:>12.2f}"
                    print(f"{line} {made:>12.2f}")
        finally:
            stop_server(process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
