"""TorchScript models served by a real ``shoal serve`` through the built-in PyTorch backend.

The repository is written in ``tmp_path`` with modules scripted or traced here: Triton's two
naming conventions, a dynamically batched model, string lists, and broken models. Results are
checked against running the same module directly. Skipped when torch is missing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List  # noqa: UP035 -- TorchScript reads these annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

torch = pytest.importorskip("torch")

from tests.integration.inputs import http_inputs  # noqa: E402
from tests.integration.server import ShoalServer  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # torch.jit in torch >= 2.9
]


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Scale(torch.nn.Module):
    """y = x @ W + bias, named arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(3, 2))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + bias


class Upper(torch.nn.Module):
    def forward(self, words: List[str]) -> List[str]:  # noqa: UP006
        return [w.upper() for w in words]


class ToInt(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64)


ADD_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# Inputs named after forward()'s arguments, listed in another order. Three requests of 1, 2
# and 3 rows make the preferred batch of 6: one forward() call, at once.
SCALE_CONFIG = """
backend: "pytorch"
max_batch_size: 8
input [
  { name: "bias" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "x" data_type: TYPE_FP32 dims: [ 3 ] }
]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

STRINGS_CONFIG = """
backend: "pytorch"
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""

TO_INT_CONFIG = """
backend: "pytorch"
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def save(root: Path, name: str, module: torch.nn.Module, config: str | None) -> Path:
    path = root / name / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    torch.jit.save(torch.jit.script(module), str(path))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torch_repo")
    save(root, "addsub", AddSub(), ADD_CONFIG)
    save(root, "scale", Scale(), SCALE_CONFIG)
    save(root, "upper", Upper(), STRINGS_CONFIG)
    save(root, "to_int", ToInt(), TO_INT_CONFIG)
    # Broken: no configuration (a TorchScript file cannot describe its tensors) ...
    save(root, "no_config", AddSub(), None)
    # ... a file that is not TorchScript ...
    (root / "not_torchscript" / "1").mkdir(parents=True)
    (root / "not_torchscript" / "1" / "model.pt").write_bytes(b"not a model")
    (root / "not_torchscript" / "config.pbtxt").write_text(ADD_CONFIG)
    # ... and strings of two dimensions.
    save(root, "strings_2d", Upper(), STRINGS_CONFIG.replace("dims: [ -1 ] }", "dims: [ 2, 2 ] }"))
    return root


@pytest.fixture(scope="module")
def server(repo):
    with ShoalServer(repo, timeout=120) as running:
        yield running


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield c
    c.close()


def test_index_named_tensors_over_http_and_grpc(server, client, repo):
    direct = torch.jit.load(str(repo / "addsub" / "1" / "model.pt"))
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 3, dtype=np.float32)
    want_sum, want_diff = (t.numpy() for t in direct(torch.from_numpy(a), torch.from_numpy(b)))
    result = client.infer("addsub", http_inputs(INPUT__0=a, INPUT__1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), want_sum)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), want_diff)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = []
        for name, array in (("INPUT__1", b), ("INPUT__0", a)):
            tensor = grpcclient.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        wanted = [grpcclient.InferRequestedOutput("OUTPUT__1")]
        result = grpc.infer("addsub", inputs, outputs=wanted, client_timeout=60)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), want_diff)
        assert result.as_numpy("OUTPUT__0") is None  # not requested, not sent
    finally:
        grpc.close()


def test_named_arguments_batched_into_one_forward_call(client, server, repo):
    direct = torch.jit.load(str(repo / "scale" / "1" / "model.pt"))
    xs = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + n for n in (1, 2, 3)]
    biases = [np.full((n, 2), n, dtype=np.float32) for n in (1, 2, 3)]

    def infer(pair: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            return own.infer("scale", http_inputs(x=pair[0], bias=pair[1])).as_numpy("y")
        finally:
            own.close()

    with ThreadPoolExecutor(len(xs)) as pool:
        ys = list(pool.map(infer, zip(xs, biases, strict=True)))
    for x, bias, y in zip(xs, biases, ys, strict=True):
        with torch.no_grad():
            expected = direct(torch.from_numpy(x), torch.from_numpy(bias)).numpy()
        np.testing.assert_allclose(y, expected)
    stats = client.get_inference_statistics("scale")["model_stats"][0]
    assert stats["inference_count"] == 6
    assert stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [6]


def test_strings_are_lists_of_str(client):
    words = np.array([b"alpha", b"beta"], dtype=np.object_)
    result = client.infer("upper", http_inputs(INPUT__0=words))
    assert result.as_numpy("OUTPUT__0").tolist() == [b"ALPHA", b"BETA"]


def test_an_output_of_the_wrong_datatype_is_an_error_naming_model_and_tensor(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("to_int", http_inputs(INPUT__0=np.ones(4, dtype=np.float32)))
    assert (
        "model 'to_int': configuration expects datatype TYPE_FP32 for output 'OUTPUT__0', "
        "model provides TYPE_INT64" in str(caught.value)
    )
    result = client.infer(
        "addsub", http_inputs(INPUT__0=np.ones(4, np.float32), INPUT__1=np.ones(4, np.float32))
    )
    assert result.as_numpy("OUTPUT__1").tolist() == [0, 0, 0, 0]  # others keep serving


def test_broken_models_fail_to_load_with_a_reason_naming_them(client):
    reasons = {
        entry["name"]: entry.get("reason", "")
        for entry in client.get_model_repository_index()
        if entry.get("state") != "READY"
    }
    assert "unable to load model 'no_config': a TorchScript model" in reasons["no_config"]
    assert "cannot be auto-completed" in reasons["no_config"]
    assert (
        "unable to load model 'not_torchscript' version 1: '" in reasons["not_torchscript"]
        and "is not a TorchScript model" in reasons["not_torchscript"]
    )
    assert (
        "'strings_2d': input 'INPUT__0' is TYPE_STRING with 2 dimensions" in (reasons["strings_2d"])
    )
    assert {"addsub", "scale", "upper", "to_int"}.isdisjoint(reasons)
