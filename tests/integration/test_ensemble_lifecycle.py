"""An ensemble follows its step models through explicit load and unload, as Triton 2.51 does
(each step below was checked against it on the same models)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, REPO_ROOT, ShoalServer

pytestmark = pytest.mark.timeout(180)

ENSEMBLE = "ensemble_add_sub"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensemble_lifecycle")
    shutil.copytree(BUNDLED / "add_sub", repo / "add_sub")
    shutil.copytree(REPO_ROOT / "benchmarks" / "models" / ENSEMBLE, repo / ENSEMBLE)
    with ShoalServer(repo, extra_args=("--model-control-mode", "explicit")) as server:
        c = httpclient.InferenceServerClient(server.url)
        yield c
        c.close()


def _states(client) -> dict[str, tuple[str, str]]:
    return {
        m["name"]: (m.get("state", ""), m.get("reason", ""))
        for m in client.get_model_repository_index()
    }


def _infer(client) -> np.ndarray:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(tensor)
    return client.infer(ENSEMBLE, inputs).as_numpy("OUTPUT0")


def test_an_ensemble_follows_its_step_models(client):
    # Loading the ensemble loads its step model; unload_dependents unloads that one with it.
    client.load_model(ENSEMBLE)
    assert client.is_model_ready("add_sub")
    client.unload_model(ENSEMBLE, unload_dependents=True)
    assert _states(client) == {
        "add_sub": ("UNAVAILABLE", "unloaded"),
        ENSEMBLE: ("UNAVAILABLE", "unloaded"),
    }
    # A step model that was unloaded is loaded again with the ensemble.
    client.load_model(ENSEMBLE)
    assert client.is_model_ready("add_sub") and client.is_model_ready(ENSEMBLE)

    # Unloading a step model unloads the ensemble; loading it again brings the ensemble back.
    client.unload_model("add_sub")
    assert _states(client)[ENSEMBLE] == ("UNAVAILABLE", "unloaded")
    assert not client.is_model_ready(ENSEMBLE)
    with pytest.raises(InferenceServerException) as info:
        _infer(client)
    assert info.value.status() == "404"  # as Triton answers for an unloaded model
    client.load_model("add_sub")
    assert client.is_model_ready(ENSEMBLE)
    np.testing.assert_array_equal(_infer(client), 2 * np.arange(4, dtype=np.float32))

    # A step model loaded by name stays when the ensemble goes with unload_dependents.
    client.unload_model(ENSEMBLE, unload_dependents=True)
    assert _states(client)["add_sub"] == ("READY", "")


def test_unloading_a_model_that_is_not_loaded_is_no_error(client):
    client.unload_model("never_heard_of_it")
