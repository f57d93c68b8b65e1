"""Which ``model.py`` runs a model whose backend shoal does not run itself."""

from __future__ import annotations

import pytest

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.models.python_backends import runtime_file


@pytest.mark.parametrize(
    "proto",
    [
        pb.ModelConfig(backend="python"),
        pb.ModelConfig(backend="onnxruntime"),
        pb.ModelConfig(backend="pytorch"),
        pb.ModelConfig(platform="ensemble"),
        pb.ModelConfig(),
    ],
)
def test_shoals_own_backends_and_ensembles_have_no_runtime_file(tmp_path, proto):
    assert runtime_file(proto, str(tmp_path)) is None


def test_a_backend_directory_with_model_py_is_a_python_based_backend(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "model.py").write_text("")
    found = runtime_file(pb.ModelConfig(backend="vllm"), str(tmp_path))
    assert found == (tmp_path / "vllm" / "model.py").resolve()


def test_a_missing_backend_names_what_was_looked_for(tmp_path):
    with pytest.raises(model_config.ConfigError) as raised:
        runtime_file(pb.ModelConfig(backend="tensorrt"), str(tmp_path))
    text = str(raised.value)
    assert "unable to find backend library for backend 'tensorrt'" in text
    assert str(tmp_path / "tensorrt" / "model.py") in text


def test_a_cpp_backend_is_named_as_one_shoal_cannot_run(tmp_path):
    (tmp_path / "fil").mkdir()
    (tmp_path / "fil" / "libtriton_fil.so").write_bytes(b"")
    with pytest.raises(model_config.ConfigError, match=r"libtriton_fil.so, a C\+\+ backend"):
        runtime_file(pb.ModelConfig(backend="fil"), str(tmp_path))
