"""What it costs that inputs are the model's own (docs/decisions.md, "Writable inputs").

    .venv/bin/python -m benchmarks.writable_inputs               # 4 and 64 MiB, 20 requests each
    .venv/bin/python -m benchmarks.writable_inputs --sizes-mib 4 --requests 50

It starts ``shoal serve`` with three models that take one FP32 input and answer one number:

* ``reads``: ``x.sum()`` (a model that only reads);
* ``writes``: ``x += 1`` on the array ``as_numpy()`` gave, then ``x.sum()``;
* ``copies``: ``x = x.copy(); x += 1`` first, what a model had to do while inputs were read-only.

Each is sent the same tensor two ways: in the HTTP body (staged for that request alone: the model
gets the block itself) and from the client's system shared memory (others may read it: the model
gets a copy-on-write mapping). Per cell it prints the mean time inside the stub, from the
statistics extension: ``compute_input`` (building the request: mapping the input) plus
``compute_infer`` (``execute``: where page copies of a write land), in milliseconds, so the HTTP
transfer of the tensor does not drown the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from benchmarks.batching import START_TIMEOUT_S, machine, server_ready, stop_server

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "reads": "s = x.sum()",
    "writes": "x += 1\n            s = x.sum()",
    "copies": "x = x.copy()\n            x += 1\n            s = x.sum()",
}
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            {body}
            out = np.array([s], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("S", out)]))
        return responses
"""
CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "S" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def write_repository(root: Path) -> None:
    for name, body in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL.format(body=body))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))


def start(repo: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    command = [
        sys.executable,
        *("-m", "shoal.cli", "serve", "--model-repository", str(repo)),
        *("--http-address", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false"),
        *("--allow-metrics", "false", "--http-max-input-size", str(256 << 20)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log.open("wb"), cwd=ROOT)
    assert process.stdout is not None
    url = ""
    for raw in process.stdout:
        parts = raw.decode(errors="replace").split()
        if parts[:2] == ["SHOAL_LISTENING", "http"]:
            url = f"127.0.0.1:{parts[-1]}"
            break
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (url and server_ready(url)):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError(f"shoal serve did not become ready; see {log}")
        time.sleep(0.05)
    return process, url


def stub_ns(url: str, model: str) -> tuple[int, int]:
    """(compute_input + compute_infer nanoseconds, successful requests) so far."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]["inference_stats"]
    total = int(stats["compute_input"]["ns"]) + int(stats["compute_infer"]["ns"])
    return total, int(stats["success"]["count"])


def cell(
    client: httpclient.InferenceServerClient, url: str, model: str, tensor: object, requests: int
) -> float:
    """Mean milliseconds inside the stub per request (after two warm-up requests)."""
    for _ in range(2):
        client.infer(model, [tensor])  # type: ignore[list-item]
    ns0, n0 = stub_ns(url, model)
    for _ in range(requests):
        client.infer(model, [tensor])  # type: ignore[list-item]
    ns1, n1 = stub_ns(url, model)
    return (ns1 - ns0) / max(n1 - n0, 1) / 1e6


def run_size(url: str, mib: int, requests: int) -> list[tuple[str, str, float]]:
    count = mib * (1 << 20) // 4
    x = np.random.default_rng(0).random(count, dtype=np.float32)
    client = httpclient.InferenceServerClient(url, network_timeout=300)
    rows = []
    body = httpclient.InferInput("X", [count], "FP32")
    body.set_data_from_numpy(x, binary_data=True)
    key = f"/shoal_bench_writable_{os.getpid()}"
    handle = shm.create_shared_memory_region("bench_in", key, x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("bench_in", key, x.nbytes)
        region = httpclient.InferInput("X", [count], "FP32")
        region.set_shared_memory("bench_in", x.nbytes)
        for how, tensor in (("HTTP body (in place)", body), ("client shm (copy-on-write)", region)):
            for model in MODELS:
                rows.append((how, model, cell(client, url, model, tensor, requests)))
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
        client.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"# machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="shoal-writable-") as tmp:
        repo = Path(tmp) / "repo"
        write_repository(repo)
        process, url = start(repo, Path(tmp) / "server.log")
        try:
            print("| input | size | reads | writes | copies, then writes |")
            print("|---|---|---|---|---|")
            for mib in args.sizes_mib:
                rows = run_size(url, mib, args.requests)
                for how in dict.fromkeys(r[0] for r in rows):
                    cells = [f"{ms:.2f} ms" for h, _, ms in rows if h == how]
                    print(f"| {how} | {mib} MiB | " + " | ".join(cells) + " |")
        finally:
            stop_server(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
