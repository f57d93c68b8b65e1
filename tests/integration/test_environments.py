"""EXECUTION_ENV_PATH: a model's stubs run on the interpreter of its own environment."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

MODEL = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        prefix = np.array([sys.prefix.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PREFIX", prefix)]) for _ in requests]
"""


def _model(repo: Path, name: str, env_path: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
        f"{json.dumps(env_path)} }} }}\n"
    )


def _venv(path: Path, *, with_server_packages: bool) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    if with_server_packages:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        site = path / "lib" / version / "site-packages"
        (site / "server.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def test_model_runs_on_its_environment_and_a_broken_one_fails_clearly(tmp_path):
    repo = tmp_path / "repo"
    _venv(tmp_path / "good", with_server_packages=True)
    _venv(tmp_path / "bare", with_server_packages=False)
    _model(repo, "in_env", "$$TRITON_MODEL_DIRECTORY/../../good")
    _model(repo, "bare_env", str(tmp_path / "bare"))
    with ShoalServer(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        inp = httpclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
        prefix = client.infer("in_env", [inp]).as_numpy("PREFIX")[0].decode()
        assert Path(prefix).resolve() == (tmp_path / "good").resolve()
        with pytest.raises(InferenceServerException, match="install numpy, msgpack, posix_ipc"):
            client.infer("bare_env", [inp])
        client.close()
