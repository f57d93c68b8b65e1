"""GPU settings of models on a machine without GPUs: KIND_GPU fails to load with Triton's
message, FORCE_CPU_ONLY_INPUT_TENSORS and SHOAL_NARROW_CUDA_VISIBLE_DEVICES are checked at
load time, and a BLS call that prefers GPU memory gets its outputs on the CPU."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from shoal.ipc.cuda import cuda_device_count
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(cuda_device_count() > 0, reason="checks the behaviour without a GPU"),
]

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "WHERE" data_type: TYPE_STRING dims: [ 2 ] }
]
"""

#: Reports where its input and the output of a BLS call to add_sub (GPU preferred) are.
MODEL = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.where = json.dumps([args["model_instance_kind"], visible])

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            reply = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", tensor.as_numpy()),
                        pb_utils.Tensor("INPUT1", tensor.as_numpy())],
                requested_output_names=["OUTPUT0"],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0),
            ).exec()
            out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
            flags = json.dumps([tensor.is_cpu(), out.is_cpu()])
            where = np.array([flags.encode(), self.where.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", out.as_numpy()), pb_utils.Tensor("WHERE", where)]))
        return responses
"""


def _model(repo: Path, name: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL)
    config = f'name: "{name}"\nbackend: "python"\n{IO}\n{textwrap.dedent(extra)}'
    (repo / name / "config.pbtxt").write_text(config)


def _parameter(key: str, value: str) -> str:
    return f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_config")
    _model(repo, "on_gpu", "instance_group [ { kind: KIND_GPU count: 1 } ]")
    _model(repo, "on_gpu_1", "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]")
    _model(repo, "bad_force", _parameter("FORCE_CPU_ONLY_INPUT_TENSORS", "maybe"))
    _model(repo, "bad_narrow", _parameter("SHOAL_NARROW_CUDA_VISIBLE_DEVICES", "true"))
    gpu_inputs = _parameter("FORCE_CPU_ONLY_INPUT_TENSORS", "no")
    _model(repo, "cpu_model", gpu_inputs + _parameter("SHOAL_NARROW_CUDA_VISIBLE_DEVICES", "yes"))
    flags = ("--strict-readiness", "false", "--cuda-memory-pool-byte-size", "0:67108864")
    with ShoalServer(BUNDLED, repo, extra_args=flags) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpclient.InferenceServerClient(server.url) as triton:
        yield triton


def _reasons(client) -> dict[str, str]:
    return {m["name"]: m.get("reason", "") for m in client.get_model_repository_index()}


def test_kind_gpu_fails_to_load_with_tritons_message(client) -> None:
    reasons = _reasons(client)
    assert (
        "instance group 'on_gpu_0' of model 'on_gpu' has kind KIND_GPU but no GPUs are available"
        in reasons["on_gpu"]
    )
    assert "lists GPU 1, which is not available (available GPUs: none)" in reasons["on_gpu_1"]


def test_gpu_parameters_are_checked_when_the_model_loads(client) -> None:
    reasons = _reasons(client)
    assert "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: 'maybe'" in reasons["bad_force"]
    assert "Incorrect value for SHOAL_NARROW_CUDA_VISIBLE_DEVICES: 'true'" in reasons["bad_narrow"]


def test_a_cpu_model_with_gpu_parameters_serves_on_the_cpu(client) -> None:
    data = np.arange(4, dtype=np.float32)
    inputs = [httpclient.InferInput("IN", [4], "FP32")]
    inputs[0].set_data_from_numpy(data)
    result = client.infer("cpu_model", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)
    flags, where = (item.decode() for item in result.as_numpy("WHERE"))
    assert flags == "[true, true]"  # the input and the GPU-preferred BLS output: CPU here
    assert where == '["CPU", null]'  # KIND_CPU: narrowing does not apply
