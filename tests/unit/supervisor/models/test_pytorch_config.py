"""A TorchScript model's configuration must list its tensors: nothing can complete it."""

from __future__ import annotations

import pytest

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.models.autocomplete import is_pytorch_model, require_pytorch_config


def proto(**fields) -> pb.ModelConfig:
    config = pb.ModelConfig(**fields)
    return config


def test_which_models_are_pytorch(tmp_path):
    assert is_pytorch_model(tmp_path, proto(backend="pytorch"))
    assert is_pytorch_model(tmp_path, proto(platform="pytorch_libtorch"))
    assert not is_pytorch_model(tmp_path, proto(backend="python"))
    assert not is_pytorch_model(tmp_path, proto(platform="onnxruntime_onnx"))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.pt").write_bytes(b"")
    assert is_pytorch_model(tmp_path, proto())  # found from the file: no config.pbtxt


def test_inputs_and_outputs_are_required(tmp_path):
    tensor = {"name": "INPUT__0", "data_type": pb.TYPE_FP32, "dims": [4]}
    complete = proto(backend="pytorch", input=[tensor], output=[{**tensor, "name": "OUTPUT__0"}])
    require_pytorch_config(tmp_path, complete, "m")
    require_pytorch_config(tmp_path, proto(backend="python"), "m")
    with pytest.raises(model_config.ConfigError) as caught:
        require_pytorch_config(tmp_path, proto(backend="pytorch", input=[tensor]), "m")
    message = str(caught.value)
    assert "unable to load model 'm': a TorchScript model" in message
    assert "must list the outputs" in message
    with pytest.raises(model_config.ConfigError, match="must list the inputs and outputs"):
        require_pytorch_config(tmp_path, proto(platform="pytorch_libtorch"), "m")
