"""Inputs are the model's own, as on Triton: ``x = t.as_numpy(); x /= 255`` works, and no one
else (another step of an ensemble, the client's shared memory) ever sees the write."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

# Divides its input in place and returns that same array: the response must carry the write.
WRITER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            x /= 255
            x[0] = -1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""

# Only reads: returns its input unchanged.
READER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

STEP_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""

# X feeds both steps: the writer's write must not reach the reader.
FAN_OUT = """name: "fan_out"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "WRITTEN" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "READ" data_type: TYPE_FP32 dims: [ -1 ] }
]
ensemble_scheduling {
  step [
    { model_name: "writer" model_version: -1
      input_map { key: "X" value: "X" } output_map { key: "Y" value: "WRITTEN" } },
    { model_name: "reader" model_version: -1
      input_map { key: "X" value: "X" } output_map { key: "Y" value: "READ" } }
  ]
}
"""

# 16 values take the copy path, 2**18 (1 MiB) the copy-on-write mapping.
SIZES = [16, 1 << 18]


def _repo(root: Path) -> Path:
    for name, source in (("writer", WRITER), ("reader", READER)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(STEP_CONFIG.format(name=name))
    (root / "fan_out" / "1").mkdir(parents=True)
    (root / "fan_out" / "config.pbtxt").write_text(FAN_OUT)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ShoalServer(_repo(tmp_path_factory.mktemp("writable"))) as running:
        yield running


def _expected(x: np.ndarray) -> np.ndarray:
    y = x / np.float32(255)
    y[0] = -1.0
    return y


def _input(module, x: np.ndarray):  # type: ignore[no-untyped-def]
    tensor = module.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_model_writes_its_input_in_place(server, module, size):
    url = server.url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        for round_ in range(3):  # the same blocks come back: each request sees its own bytes
            x = np.arange(size, dtype=np.float32) + round_
            result = client.infer("writer", [_input(module, x)])
            np.testing.assert_allclose(result.as_numpy("Y"), _expected(x), rtol=1e-6)
            read = client.infer("reader", [_input(module, x)])
            np.testing.assert_array_equal(read.as_numpy("Y"), x)
    finally:
        client.close()


@pytest.mark.parametrize("size", SIZES)
def test_a_write_in_one_ensemble_step_is_not_seen_by_another(server, size):
    client = httpclient.InferenceServerClient(server.url)
    try:
        for round_ in range(3):
            x = np.arange(size, dtype=np.float32) * 3 + round_
            result = client.infer("fan_out", [_input(httpclient, x)])
            np.testing.assert_allclose(result.as_numpy("WRITTEN"), _expected(x), rtol=1e-6)
            np.testing.assert_array_equal(result.as_numpy("READ"), x)
    finally:
        client.close()


@pytest.mark.parametrize("size", SIZES)
def test_a_write_never_reaches_the_clients_shared_memory(server, size):
    client = httpclient.InferenceServerClient(server.url)
    key = f"/shoal_writable_{os.getpid()}_{size}"
    nbytes = size * 4
    handle = shm.create_shared_memory_region("writable_in", key, nbytes)
    try:
        x = np.linspace(1, 2, size, dtype=np.float32)
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("writable_in", key, nbytes)
        tensor = httpclient.InferInput("X", [size], "FP32")
        tensor.set_shared_memory("writable_in", nbytes)
        for _ in range(2):  # the second request must read the client's bytes, unchanged
            result = client.infer("writer", [tensor])
            np.testing.assert_allclose(result.as_numpy("Y"), _expected(x), rtol=1e-6)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [size]), x)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
        client.close()
