"""Repository-API load requests whose names or ``file:`` keys cannot be files are client errors
(400 / INVALID_ARGUMENT naming the parameter), never 500, and leave nothing behind."""

from __future__ import annotations

import glob
import json
import tempfile
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODEL = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("O", r.inputs()[0].as_numpy())])
                for r in requests]
"""
CONFIG = json.dumps(
    {
        "backend": "python",
        "input": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "O", "data_type": "TYPE_INT32", "dims": [1]}],
    }
)

#: (model name, files, words the error must carry)
CASES = {
    "file:.": ("m", {"file:.": MODEL}, "names a directory"),
    "file:1/": ("m", {"file:1/": MODEL, "file:1/model.py": MODEL}, "names a directory"),
    "NUL in a file key": ("m", {"file:1/mo\0del.py": MODEL}, "NUL"),
    "a file and a directory": ("m", {"file:1": MODEL, "file:1/model.py": MODEL}, "same path"),
    "overlong model name": ("n" * 300, {"file:1/model.py": MODEL}, "at most 255 bytes"),
    "overlong file name": ("m", {"file:1/" + "a" * 300: MODEL}, "over 255 bytes"),
    "overlong path": ("m", {"file:" + "/".join(["a" * 200] * 30): MODEL}, "over 3072 bytes"),
}


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit")
    with ShoalServer(TEST_MODELS, extra_args=args) as srv:
        yield srv


def _scratch_dirs() -> set[str]:
    return set(glob.glob(f"{tempfile.gettempdir()}/shoal-model-*"))


@pytest.mark.parametrize("case", list(CASES))
def test_http_load_refuses_unusable_names_and_files(server, case):
    name, files, words = CASES[case]
    client = httpclient.InferenceServerClient(server.url)
    before = _scratch_dirs()
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name, config=CONFIG, files=files)
    assert info.value.status() == "400", info.value
    assert words in info.value.message(), info.value
    assert _scratch_dirs() == before
    client.load_model("ok", config=CONFIG, files={"file:1/model.py": MODEL})
    assert client.is_model_ready("ok")
    client.unload_model("ok")
    client.close()


@pytest.mark.parametrize("case", ["file:.", "NUL in a file key", "overlong path"])
def test_grpc_load_refuses_unusable_names_and_files(server, case):
    name, files, words = CASES[case]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name, config=CONFIG, files=files)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value
    assert words in info.value.message(), info.value
    client.close()


def test_a_setting_accepted_with_no_effect_is_logged_at_load(server):
    # dynamic_batching on a model that cannot batch: accepted as Triton does, but the user is
    # told in the log rather than left to wonder why nothing is batched.
    config = json.loads(CONFIG) | {"dynamic_batching": {}}
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.load_model("warned", config=json.dumps(config), files={"file:1/model.py": MODEL})
        assert client.is_model_ready("warned")
        assert "model 'warned' has dynamic_batching but max_batch_size 0" in server.output
    finally:
        client.unload_model("warned")
        client.close()


@pytest.mark.parametrize("path", ["index", "models/m/load", "models/m/unload"])
def test_a_named_repository_is_refused_as_triton_refuses_it(server, path):
    url = f"http://{server.url}/v2/repository/other/{path}"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=10)
    assert info.value.code == 501
    body = json.loads(info.value.read())
    assert body == {"error": "'repository_name' specification is not supported"}
