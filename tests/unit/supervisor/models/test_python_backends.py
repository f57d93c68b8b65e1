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


@pytest.mark.parametrize("backend", ["identity", "python"])
def test_a_runtime_outside_the_backend_directory_is_refused(tmp_path, backend):
    # Triton's L0_model_config special_cases/runtime_escape
    (tmp_path / "dummy_runtime").mkdir()
    (tmp_path / "dummy_runtime" / "libtriton_identity.so").write_bytes(b"")
    proto = pb.ModelConfig(
        name="m", backend=backend, runtime="../dummy_runtime/libtriton_identity.so"
    )
    with pytest.raises(model_config.ConfigError) as raised:
        runtime_file(proto, str(tmp_path))
    assert (
        "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend directory"
        in str(raised.value)
    )
    assert raised.value.field == "runtime"


def test_a_runtime_that_is_not_there_is_named(tmp_path):
    # Triton's L0_model_config special_cases/invalid_runtime
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "model.py").write_text("")
    proto = pb.ModelConfig(name="m", backend="identity", runtime="__invalid_runtime__")
    with pytest.raises(model_config.ConfigError) as raised:
        runtime_file(proto, str(tmp_path))
    assert "unable to find backend library '__invalid_runtime__' for model 'm'" in str(raised.value)


def test_a_python_runtime_in_the_backend_directory_runs(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "other.py").write_text("")
    found = runtime_file(pb.ModelConfig(backend="vllm", runtime="other.py"), str(tmp_path))
    assert found == (tmp_path / "vllm" / "other.py").resolve()
