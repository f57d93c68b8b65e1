"""``auto_complete_config`` sees the model's name where ``config.pbtxt`` gives none, as in
Triton (which names the configuration after its directory before the backend completes it):
models read it, and the Python backend's refusals name the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

NAMED = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        name = config.as_dict()["name"]
        if name != "unnamed":
            raise ValueError(f"auto_complete_config saw the name {name!r}")
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

REFUSED = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_model_transaction_policy({"decoupled": True, "other": 1})
        return config
"""


def test_auto_complete_sees_the_directorys_name_and_refusals_name_the_model(tmp_path: Path):
    for name, code in (("unnamed", NAMED), ("refused", REFUSED)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(code)
        (tmp_path / name / "config.pbtxt").write_text('backend: "python"\n')
    with ShoalServer(tmp_path, extra_args=("--exit-on-error=false",)) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            assert client.is_model_ready("unnamed")
            assert client.get_model_config("unnamed")["name"] == "unnamed"
            assert not client.is_model_ready("refused")
            index = {m["name"]: m for m in client.get_model_repository_index()}
        finally:
            client.close()
    assert "'refused'" in index["refused"]["reason"], index["refused"]
