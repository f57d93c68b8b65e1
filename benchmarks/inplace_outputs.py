"""What building an output in place saves (docs/python_models.md, "Outputs built in place").

    .venv/bin/python -m benchmarks.inplace_outputs               # 4 and 64 MiB, 20 requests each
    .venv/bin/python -m benchmarks.inplace_outputs --sizes-mib 4 --requests 50

It starts ``shoal serve`` with two models that answer an FP32 output of N elements, all equal to
the request's value V:

* ``copies``: ``y = np.empty(N); y.fill(V)`` and ``pb_utils.Tensor("Y", y)``: the stub copies
  ``y`` into its output arena after ``execute`` (what every Triton model does);
* ``in_place``: ``t = pb_utils.empty_output_tensor("Y", [N], np.float32)`` and
  ``t.as_numpy().fill(V)``: the model writes the arena block the response carries.

Per size and model it prints the mean time inside the stub from the statistics extension, in
milliseconds: ``compute_infer`` (``execute``: the fill, and for ``copies`` the fresh pages of its
own array) and ``compute_output`` (writing outputs into the arena: the copy), so the HTTP transfer
of the output does not drown the figure. Each response is checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from benchmarks.batching import machine, stop_server
from benchmarks.writable_inputs import start

MODELS = {
    "copies": "y = np.empty(n, dtype=np.float32)\n            y.fill(v)\n"
    '            out = pb_utils.Tensor("Y", y)',
    "in_place": 'out = pb_utils.empty_output_tensor("Y", [n], np.float32)\n'
    "            out.as_numpy().fill(v)",
}
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            v = float(pb_utils.get_input_tensor_by_name(request, "V").as_numpy()[0])
            {body}
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "N" data_type: TYPE_INT64 dims: [ 1 ] }},
        {{ name: "V" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def write_repository(root: Path) -> None:
    for name, body in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL.format(body=body))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))


def stub_ns(url: str, model: str) -> tuple[int, int, int]:
    """(compute_infer ns, compute_output ns, successful requests) so far."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]["inference_stats"]
    return (
        int(stats["compute_infer"]["ns"]),
        int(stats["compute_output"]["ns"]),
        int(stats["success"]["count"]),
    )


def _infer(client: httpclient.InferenceServerClient, model: str, n: int, value: float) -> None:
    inputs = [httpclient.InferInput("N", [1], "INT64"), httpclient.InferInput("V", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([n], dtype=np.int64))
    inputs[1].set_data_from_numpy(np.array([value], dtype=np.float32))
    y = client.infer(model, inputs).as_numpy("Y")
    if y is None or y.shape != (n,) or y[0] != value or y[-1] != value:
        raise AssertionError(f"{model}: wrong output for {n} x {value}")


def cell(url: str, model: str, mib: int, requests: int) -> tuple[float, float]:
    """Mean (compute_infer, compute_output) milliseconds per request, after two warm-ups."""
    n = mib * (1 << 20) // 4
    client = httpclient.InferenceServerClient(url, network_timeout=300)
    try:
        for i in range(2):
            _infer(client, model, n, float(i))
        infer0, output0, count0 = stub_ns(url, model)
        for i in range(requests):
            _infer(client, model, n, float(i + 2))
        infer1, output1, count1 = stub_ns(url, model)
    finally:
        client.close()
    done = max(count1 - count0, 1)
    return (infer1 - infer0) / done / 1e6, (output1 - output0) / done / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"# machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="shoal-inplace-") as tmp:
        repo = Path(tmp) / "repo"
        write_repository(repo)
        process, url = start(repo, Path(tmp) / "server.log")
        try:
            print("| output | model | compute_infer | compute_output | stub total |")
            print("|---|---|---|---|---|")
            for mib in args.sizes_mib:
                for model in MODELS:
                    infer, output = cell(url, model, mib, args.requests)
                    print(
                        f"| {mib} MiB | {model} | {infer:.2f} ms | {output:.2f} ms | "
                        f"{infer + output:.2f} ms |"
                    )
        finally:
            stop_server(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
