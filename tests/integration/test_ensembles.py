"""Ensembles: a diamond-shaped DAG whose intermediates pass between stubs by descriptor."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit", "--load-model", "ens_diamond")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args) as srv:
        yield srv


def _x(values):
    inp = httpclient.InferInput("X", [4], "FP32")
    inp.set_data_from_numpy(np.asarray(values, dtype=np.float32))
    return inp


def test_diamond_ensemble(server):
    client = httpclient.InferenceServerClient(server.url)
    # Loading the ensemble loaded its step models, as Triton does.
    for model in ("ens_diamond", "ens_scale", "identity", "add_sub"):
        assert client.is_model_ready(model), model
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    for _ in range(20):
        result = client.infer("ens_diamond", [_x(x)])
        np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * x + x)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), 2 * x - x)
    meta = client.get_model_metadata("ens_diamond")
    assert meta["platform"] == "ensemble"
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["ens_diamond"]["inference_stats"]["success"]["count"] == 20
    assert stats["ens_scale"]["inference_stats"]["success"]["count"] >= 20
    assert stats["add_sub"]["execution_count"] >= 20
    client.close()


def test_ensemble_errors_name_the_step(server):
    client = httpclient.InferenceServerClient(server.url)
    bad = httpclient.InferInput("X", [3], "FP32")
    bad.set_data_from_numpy(np.ones(3, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'X'"):
        client.infer("ens_diamond", [bad])
    assert client.is_server_live()
    client.close()


def test_ensemble_with_mismatched_datatypes_fails_at_load(server):
    client = httpclient.InferenceServerClient(server.url)
    expected = r"tensor 'X' is INT32 but 'INPUT[01]' of model 'add_sub' is FP32"
    with pytest.raises(InferenceServerException, match=expected):
        client.load_model("ens_bad_dtype")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "INT32" in index["ens_bad_dtype"]["reason"]
    client.close()
