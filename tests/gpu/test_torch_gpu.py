"""TorchScript models on a GPU instance (``KIND_GPU``): the module runs on ``cuda:<device>``,
inputs go to the device and outputs come back, checked against the module run on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

torch = pytest.importorskip("torch")

from tests.integration.server import ShoalServer  # noqa: E402
from tests.integration.test_torch import (  # noqa: E402
    ADD_CONFIG,
    SCALE_CONFIG,
    AddSub,
    Scale,
    save,
)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # torch.jit in torch >= 2.9
]
ON_GPU = "instance_group [ { count: 1 kind: KIND_GPU } ]\n"
WHERE_CONFIG = """
backend: "pytorch"
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class WhereAmI(torch.nn.Module):
    """1.0 everywhere when forward runs on a CUDA device, else 0.0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0 + (1.0 if x.is_cuda else 0.0)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torch_gpu_repo")
    save(root, "addsub", AddSub(), ADD_CONFIG + ON_GPU)
    save(root, "scale", Scale(), SCALE_CONFIG.replace("kind: KIND_CPU", "kind: KIND_GPU"))
    save(root, "where", WhereAmI(), WHERE_CONFIG + ON_GPU)
    return root


def _infer(url: str, model: str, arrays: dict[str, np.ndarray]) -> grpcclient.InferResult:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    with grpcclient.InferenceServerClient(url) as client:
        return client.infer(model, inputs, client_timeout=60)


def test_torchscript_models_run_on_the_instance_gpu(repo) -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 3, dtype=np.float32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    bias = np.ones((2, 2), dtype=np.float32)
    with ShoalServer(repo, timeout=120) as server:
        added = _infer(server.grpc_url, "addsub", {"INPUT__0": a, "INPUT__1": b})
        scaled = _infer(server.grpc_url, "scale", {"x": x, "bias": bias})
        where = _infer(server.grpc_url, "where", {"INPUT__0": a})
    np.testing.assert_array_equal(where.as_numpy("OUTPUT__0"), np.ones(4, np.float32))
    np.testing.assert_array_equal(added.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(added.as_numpy("OUTPUT__1"), a - b)
    direct = torch.jit.load(str(repo / "scale" / "1" / "model.pt"))
    want = direct(torch.from_numpy(x), torch.from_numpy(bias)).detach().numpy()
    np.testing.assert_allclose(scaled.as_numpy("y"), want, rtol=1e-5)
