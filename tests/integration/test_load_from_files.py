"""Loading a model from files in the load request (``file:<path>`` parameters), as Triton's
Python-backend QA does it: keys may start with '/', and names Triton's Python backend refuses
for its stub processes are refused."""

from __future__ import annotations

import base64
import json
import os
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""


def _body(name: str, key: str = "file:/1/model.py") -> dict:
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    code = base64.b64encode(IDENTITY.encode()).decode()
    return {"parameters": {"config": json.dumps(config), key: code}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("empty_repository")
    with ShoalServer(repo, extra_args=("--model-control-mode", "explicit")) as running:
        yield running


def _load(server, name: str, body: dict) -> requests.Response:
    # The name as it is, unquoted (Triton's QA sends it with curl like this).
    request = requests.Request(
        "POST", f"http://{server.url}/v2/repository/models/{name}/load", json=body
    ).prepare()
    request.url = f"http://{server.url}/v2/repository/models/{name}/load"
    with requests.Session() as session:
        return session.send(request, timeout=60)


@pytest.mark.parametrize("name", ["TestModel123", "model-with-hyphens", "model_with_underscores"])
def test_a_file_key_with_a_leading_slash_is_relative_to_the_model(server, name):
    response = _load(server, name, _body(name))
    assert response.status_code == 200, response.text
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, 2.5]], np.float32))
    assert client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist() == [[1.5, 2.5]]
    client.unload_model(name)
    client.close()


def test_an_absolute_looking_key_stays_inside_the_model_directory(server):
    token = f"shoal-escape-{uuid.uuid4().hex}"
    body = _body("stays_inside")
    body["parameters"][f"file:/tmp/{token}"] = base64.b64encode(b"x").decode()
    response = _load(server, "stays_inside", body)
    assert response.status_code == 200, response.text
    tmp = Path(tempfile.gettempdir())
    assert not (tmp / token).exists()
    written = [d for d, _, files in os.walk(tmp) if token in files]
    assert all(Path(d).name == "tmp" and "stays_inside" in d for d in written), written
    httpclient.InferenceServerClient(server.url).unload_model("stays_inside")


@pytest.mark.parametrize(
    "name",
    [
        "model;test",
        "model|test",
        "model&test",
        "model$test",
        "model`test`",
        "model*test",
        "model(test)",
        "model!test",
        "model~test",
        "model'test'",
    ],
)
def test_a_name_with_shell_characters_is_refused_in_tritons_words(server, name):
    response = _load(server, name, _body(name))
    assert response.status_code == 400, response.text
    assert "Invalid stub name: contains invalid characters" in response.text
    assert "failed to load" in response.text
