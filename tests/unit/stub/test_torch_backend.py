"""The PyTorch backend's model class with real TorchScript modules built in the tests.

Results are checked against running the same module directly. Skipped when torch is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List  # noqa: UP035 -- TorchScript reads these annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.stub import loader  # noqa: E402
from shoal.stub.backends import builtin_backend  # noqa: E402
from shoal.stub.backends._torch_io import TorchModelError  # noqa: E402
from shoal.stub.backends.pytorch import TorchScriptModel  # noqa: E402
from tests.unit.stub.helpers import config_tensor as tensor  # noqa: E402
from tests.unit.stub.helpers import instance_args as args_for  # noqa: E402
from tests.unit.stub.helpers import server_request  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    # torch >= 2.9 deprecates torch.jit in favour of torch.export; Triton serves TorchScript.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 2 * x + y


class DictInput(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:  # noqa: UP006
        return inputs["a"] * inputs["b"]


class Upper(torch.nn.Module):
    def forward(self, words: List[str]) -> List[str]:  # noqa: UP006
        return [w.upper() for w in words]


class ToInt(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64)


def save(path: Path, module: torch.nn.Module, example: tuple | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    compiled = torch.jit.trace(module, example) if example else torch.jit.script(module)
    torch.jit.save(compiled, str(path))
    return path


def linear(path: Path) -> Path:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    return save(path, layer, (torch.ones(1, 3),))


def load(path: Path, config: dict, kind: str = "CPU") -> TorchScriptModel:
    model = TorchScriptModel(str(path))
    model.initialize(args_for({"backend": "pytorch", **config}, kind))
    return model


def outputs(response) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def fp32(*names: str, dims=(4,)) -> list[dict]:
    return [tensor(name, "TYPE_FP32", dims) for name in names]


INDEX_CONFIG = {
    "name": "addsub",
    "input": fp32("INPUT__1", "INPUT__0"),  # listed out of order on purpose
    "output": fp32("OUTPUT__1", "OUTPUT__0"),
}
LINEAR_CONFIG = {
    "name": "linear",
    "max_batch_size": 8,
    "input": fp32("INPUT__0", dims=(3,)),
    "output": fp32("OUTPUT__0", dims=(2,)),
}


class CountingModule:
    """Wraps a module to count forward calls and keep their arguments."""

    def __init__(self, module) -> None:
        self.module = module
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return self.module(*args)


def test_index_names_map_to_arguments_and_results(tmp_path):
    model = load(save(tmp_path / "1" / "model.pt", AddSub()), INDEX_CONFIG)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, dtype=np.float32)
    everything, only_sub = model.execute(
        [
            server_request({"INPUT__0": a, "INPUT__1": b}),
            server_request({"INPUT__1": b, "INPUT__0": a}, requested=["OUTPUT__1"]),
        ]
    )
    got = outputs(everything)
    np.testing.assert_array_equal(got["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT__1"], a - b)
    assert list(outputs(only_sub)) == ["OUTPUT__1"]


def test_forward_argument_names_map_inputs(tmp_path):
    path = save(tmp_path / "1" / "model.pt", Affine())
    config = {"name": "affine", "input": fp32("y", "x"), "output": fp32("z")}
    model = load(path, config)
    x, y = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    (response,) = model.execute([server_request({"y": y, "x": x})])
    direct = torch.jit.load(str(path))(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_array_equal(outputs(response)["z"], direct)


def test_a_dict_argument_gets_the_inputs_by_name(tmp_path):
    path = save(tmp_path / "1" / "model.pt", DictInput())
    config = {"name": "dict", "input": fp32("a", "b"), "output": fp32("OUTPUT__0")}
    model = load(path, config)
    a, b = np.arange(4, dtype=np.float32), np.full(4, 3, dtype=np.float32)
    (response,) = model.execute([server_request({"a": a, "b": b})])
    np.testing.assert_array_equal(outputs(response)["OUTPUT__0"], a * b)


def test_read_only_inputs_reach_torch_without_a_copy(tmp_path):
    model = load(save(tmp_path / "1" / "model.pt", AddSub()), INDEX_CONFIG)
    model.module = counting = CountingModule(model.module)
    request = server_request(
        {"INPUT__0": np.ones(4, np.float32), "INPUT__1": np.ones(4, np.float32)}
    )
    given = request.inputs()[0].as_numpy()
    assert not given.flags.writeable
    (response,) = model.execute([request])
    np.testing.assert_array_equal(outputs(response)["OUTPUT__0"], np.full(4, 2, np.float32))
    assert counting.calls[0][0].data_ptr() == given.ctypes.data  # the shared-memory view


def test_a_batch_of_requests_is_one_forward_split_back(tmp_path):
    path = linear(tmp_path / "1" / "model.pt")
    model = load(path, LINEAR_CONFIG)
    model.module = counting = CountingModule(model.module)
    xs = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + n for n in (1, 3, 2)]
    responses = model.execute([server_request({"INPUT__0": x}) for x in xs])
    assert len(counting.calls) == 1
    assert tuple(counting.calls[0][0].shape) == (6, 3)
    direct = torch.jit.load(str(path))
    for x, response in zip(xs, responses, strict=True):
        y = outputs(response)["OUTPUT__0"]
        assert y.shape == (x.shape[0], 2)
        np.testing.assert_allclose(y, direct(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)


def test_string_lists_in_and_out(tmp_path):
    config = {
        "name": "upper",
        "input": [tensor("INPUT__0", "TYPE_STRING", [-1])],
        "output": [tensor("OUTPUT__0", "TYPE_STRING", [-1])],
    }
    path = save(tmp_path / "1" / "model.pt", Upper())
    model = load(path, config)
    words = np.array([b"hello", "w\u00f6rld".encode()], dtype=np.object_)
    good, bad = model.execute(
        [
            server_request({"INPUT__0": words}),
            server_request({"INPUT__0": np.array([b"\xff"], dtype=np.object_)}),
        ]
    )
    direct = torch.jit.load(str(path))(["hello", "w\u00f6rld"])
    assert outputs(good)["OUTPUT__0"].tolist() == [w.encode() for w in direct]
    assert direct[0] == "HELLO"
    assert "input 'INPUT__0'" in bad.error().message()
    assert "UTF-8" in bad.error().message()


def test_bf16_round_trips(tmp_path):
    config = {"name": "bf", "input": [tensor("x", "TYPE_BF16", [2])], "output": []}
    config["output"] = [tensor("OUTPUT__0", "TYPE_BF16", [2])]
    model = load(save(tmp_path / "1" / "model.pt", Affine2()), config)
    words = torch.tensor([1.5, -2.0], dtype=torch.bfloat16).view(torch.int16).numpy()
    (response,) = model.execute([server_request({"x": words.view(np.uint16)})])
    got = torch.from_numpy(outputs(response)["OUTPUT__0"].view(np.int16)).view(torch.bfloat16)
    assert got.tolist() == [3.0, -4.0]


class Affine2(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_an_output_datatype_mismatch_names_model_and_output(tmp_path):
    config = {"name": "toint", "input": fp32("x"), "output": fp32("OUTPUT__0")}
    model = load(save(tmp_path / "1" / "model.pt", ToInt()), config)
    (response,) = model.execute([server_request({"x": np.ones(4, np.float32)})])
    assert response.has_error()
    assert response.error().message() == (
        "model 'toint': configuration expects datatype TYPE_FP32 for output 'OUTPUT__0', "
        "model provides TYPE_INT64"
    )


def test_a_forward_error_fails_the_requests_naming_the_model(tmp_path):
    model = load(save(tmp_path / "1" / "model.pt", AddSub()), INDEX_CONFIG)
    a, b = np.ones(4, np.float32), np.ones(3, np.float32)
    (response,) = model.execute([server_request({"INPUT__0": a, "INPUT__1": b})])
    assert response.error().message().startswith("PyTorch execute failure: model 'addsub'")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a model", "'m' version 1: '.*model.pt' is not a TorchScript model"),
        (None, "pickles from torch.save"),
    ],
)
def test_a_file_that_is_not_torchscript_is_a_load_error(tmp_path, content, message):
    path = tmp_path / "1" / "model.pt"
    path.parent.mkdir()
    if content is None:
        torch.save(torch.nn.Linear(3, 2).state_dict(), str(path))
    else:
        path.write_bytes(content)
    with pytest.raises(TorchModelError, match=message):
        load(path, {**INDEX_CONFIG, "name": "m"})


def test_a_missing_file_is_a_load_error(tmp_path):
    with pytest.raises(
        TorchModelError, match=r"'m' version 1: TorchScript model file .* not found"
    ):
        load(tmp_path / "1" / "model.pt", {**INDEX_CONFIG, "name": "m"})


def test_without_torch_the_load_error_says_what_to_install(tmp_path, monkeypatch):
    path = save(tmp_path / "1" / "model.pt", AddSub())
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets without torch
    with pytest.raises(TorchModelError, match=r"needs the torch package.*shoal\[torch\]"):
        load(path, INDEX_CONFIG)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input": fp32("INPUT__0")}, "configuration expects 1 inputs, model provides 2"),
        (
            {"input": [tensor("INPUT__0", "TYPE_STRING", [-1]), *fp32("INPUT__1")]},
            "input 'INPUT__0' (TYPE_STRING) goes to forward() argument 'a'",
        ),
        (
            {"output": [tensor("OUTPUT__0", "TYPE_STRING", [2, 2])]},
            "output 'OUTPUT__0' is TYPE_STRING with 2 dimensions",
        ),
        (
            {"input": [tensor("INPUT__0", "TYPE_UINT64", [4]), *fp32("INPUT__1")]},
            "unsupported datatype TYPE_UINT64 for input 'INPUT__0'",
        ),
    ],
)
def test_a_configuration_that_does_not_fit_is_a_load_error(tmp_path, change, message):
    path = save(tmp_path / "1" / "model.pt", AddSub())
    with pytest.raises(TorchModelError) as caught:
        load(path, {**INDEX_CONFIG, **change})
    assert message in str(caught.value)
    assert "'addsub'" in str(caught.value)


def test_a_gpu_instance_without_cuda_is_a_clear_load_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU path is tested in tests/gpu")
    path = save(tmp_path / "1" / "model.pt", AddSub())
    with pytest.raises(TorchModelError, match=r"KIND_GPU, but this torch .* sees no CUDA device"):
        load(path, INDEX_CONFIG, kind="GPU")


def test_the_stub_loader_picks_the_backend_by_name_or_platform(tmp_path):
    path = str(save(tmp_path / "1" / "model.pt", AddSub()))
    for config in ({"backend": "pytorch"}, {"platform": "pytorch_libtorch"}):
        args = args_for({"name": "m", **config})
        assert builtin_backend(args) == "pytorch"
        assert isinstance(loader.create_model(path, args), TorchScriptModel)


def test_thread_count_parameter_sets_torch_threads(tmp_path):
    before = torch.get_num_threads()
    parameters = {"INTRA_OP_THREAD_COUNT": {"string_value": "1"}}
    try:
        load(
            save(tmp_path / "1" / "model.pt", AddSub()), {**INDEX_CONFIG, "parameters": parameters}
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
