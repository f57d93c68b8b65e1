"""A load's ``config`` override outlives the load, as in Triton: a later load without one keeps
it while no file of the model is newer than the override, and reads the directory again once
one is (L0_lifecycle's test_model_config_overwite)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""

CONFIG = """
name: "ident"
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""

# One object for the repeated instance_group, as L0_lifecycle sends it: Triton's parser reads
# it as a list of one.
OVERRIDE = json.dumps(
    {
        "name": "ident",
        "backend": "python",
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": {"kind": "KIND_CPU", "count": 2},
    }
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    model = tmp_path / "ident"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(IDENTITY)
    (model / "config.pbtxt").write_text(CONFIG)
    return tmp_path


def _count(client: httpclient.InferenceServerClient) -> int:
    return client.get_model_config("ident")["instance_group"][0]["count"]


def _touch_after_now(path: Path) -> None:
    """Newer than anything the server stamped so far, whatever the file system's clock grain."""
    later = time.time() + 2
    os.utime(path, (later, later))


def test_a_plain_load_keeps_the_override_until_a_file_changes(repo):
    args = ("--model-control-mode", "explicit", "--load-model", "ident")
    with ShoalServer(repo, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert _count(client) == 1
        client.load_model("ident", config=OVERRIDE)
        assert _count(client) == 2
        client.load_model("ident")
        assert _count(client) == 2, "a plain load dropped the override of the files it kept"
        _touch_after_now(repo / "ident" / "config.pbtxt")
        client.load_model("ident")
        assert _count(client) == 1, "config.pbtxt newer than the override was not read"
        client.close()


def test_an_unload_forgets_the_override(repo):
    args = ("--model-control-mode", "explicit", "--load-model", "ident")
    with ShoalServer(repo, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        client.load_model("ident", config=OVERRIDE)
        assert _count(client) == 2
        client.unload_model("ident")
        client.load_model("ident")
        assert _count(client) == 1
        client.close()
