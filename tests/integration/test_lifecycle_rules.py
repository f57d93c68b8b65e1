"""Triton's model-lifecycle rules that its L0_lifecycle QA checks: a load's ``config`` override
outlives the load (a later load without one keeps it while no file of the model is newer than
the override, test_model_config_overwite); a model with no version directory is listed with no
version (test_parse_error_model_no_version)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

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


def _wait_for_failure(client: httpclient.InferenceServerClient, name: str) -> None:
    """Until the start-up load of ``name`` has failed (the server is live before it has)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        entries = {e["name"]: e for e in client.get_model_repository_index()}
        if entries.get(name, {}).get("reason"):
            return
        time.sleep(0.05)  # polling the index, not waiting on time
    raise TimeoutError(f"the load of '{name}' did not fail within 60 s")


def test_a_model_without_a_version_directory_has_no_available_versions(repo):
    (repo / "versionless").mkdir()
    (repo / "versionless" / "config.pbtxt").write_text(CONFIG.replace('"ident"', '"versionless"'))
    with ShoalServer(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        _wait_for_failure(client, "versionless")
        assert not client.is_model_ready("versionless")
        assert not client.is_server_ready()
        words = "Request for unknown model: 'versionless' has no available versions"
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("versionless")
        assert words in info.value.message(), info.value.message()
        assert info.value.status() == "404"
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            grpc.get_model_metadata("versionless")
        assert words in info.value.message(), info.value.message()
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert client.is_model_ready("ident")
        client.close()
        grpc.close()
