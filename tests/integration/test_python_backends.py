"""Python-based backends: ``backend: "<name>"`` runs ``<--backend-directory>/<name>/model.py``.

The backend here is built like Triton's vLLM backend: a shared ``model.py`` (with a package
beside it) whose ``auto_complete_config`` supplies the inputs, outputs and the decoupled policy,
and which reads each model's own ``<version>/model.json``.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

BACKEND = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from helpers.scaling import scale  # a package beside model.py, as vLLM's utils/


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "WHERE", "data_type": "TYPE_STRING", "dims": [1]})
        config.set_model_transaction_policy({"decoupled": True})
        return config

    def initialize(self, args):
        # vLLM's backend finds its model.json the same way: the model's version directory.
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.factor = json.load(f)["factor"]
        self.where = os.path.dirname(os.path.abspath(__file__))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            for step in (1, 2):
                y = scale(x, self.factor * step)
                where = np.array([self.where.encode()], dtype=np.object_)
                sender.send(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor("Y", y), pb_utils.Tensor("WHERE", where)]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SCALING = """
import numpy as np


def scale(x, factor):
    return (x * factor).astype(np.float32)
"""


def _layout(root: Path) -> tuple[Path, Path]:
    backends = root / "backends"
    (backends / "scaler").mkdir(parents=True)
    (backends / "scaler" / "model.py").write_text(BACKEND)
    (backends / "scaler" / "helpers").mkdir()
    (backends / "scaler" / "helpers" / "__init__.py").write_text("")
    (backends / "scaler" / "helpers" / "scaling.py").write_text(SCALING)
    (backends / "native_only").mkdir()
    (backends / "native_only" / "libtriton_native_only.so").write_bytes(b"")
    repo = root / "repo"
    for name, factor in (("double", 2.0), ("triple", 3.0)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.json").write_text(json.dumps({"factor": factor}))
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "scaler"\n')
    for name in ("missing_backend", "native_only"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "{name}"\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        )
    return repo, backends


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo, backends = _layout(tmp_path_factory.mktemp("python_backends"))
    with ShoalServer(repo, extra_args=("--backend-directory", str(backends))) as running:
        yield running, backends


def _stream(url: str, model: str, x: np.ndarray) -> list[object]:
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
        got = []
        while True:
            item = answers.get(timeout=30)
            got.append(item)
            if isinstance(item, Exception):
                break
            final = item.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return got


@pytest.mark.parametrize(("model", "factor"), [("double", 2.0), ("triple", 3.0)])
def test_models_of_a_python_based_backend_serve(server, model, factor):
    running, backends = server
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    got = _stream(running.grpc_url, model, x)
    assert not any(isinstance(item, Exception) for item in got), got
    outputs = [item for item in got if item.as_numpy("Y") is not None]  # type: ignore[attr-defined]
    assert [o.as_numpy("Y").tolist() for o in outputs] == [  # type: ignore[attr-defined]
        (x * factor).tolist(),
        (x * factor * 2).tolist(),
    ]
    where = outputs[0].as_numpy("WHERE")[0].decode()  # type: ignore[attr-defined]
    assert Path(where) == (backends / "scaler").resolve()


def test_auto_complete_config_of_the_backend_completes_the_configuration(server):
    running, _ = server
    client = httpclient.InferenceServerClient(running.url)
    try:
        config = client.get_model_config("double")
    finally:
        client.close()
    assert config["backend"] == "scaler"
    assert [i["name"] for i in config["input"]] == ["X"]
    assert [o["name"] for o in config["output"]] == ["Y", "WHERE"]
    assert config["model_transaction_policy"]["decoupled"] is True


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("missing_backend", "missing_backend/model.py does not exist"),
        ("native_only", "libtriton_native_only.so, a C++ backend"),
    ],
)
def test_a_backend_shoal_cannot_find_or_run_fails_the_load_clearly(server, model, why):
    running, _ = server
    client = httpclient.InferenceServerClient(running.url)
    try:
        assert not client.is_model_ready(model)
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    finally:
        client.close()
    reason = index[model]["reason"]
    assert f"unable to find backend library for backend '{model}'" in reason
    assert why in reason
