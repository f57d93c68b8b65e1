"""Custom metrics and model control called from inside models."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    args = (
        "--model-control-mode",
        "explicit",
        "--load-model",
        "custom_metrics",
        "--load-model",
        "model_loader",
    )
    with ShoalServer(TEST_MODELS, extra_args=args, metrics=True) as srv:
        yield srv


def test_custom_metrics_are_exported(server):
    client = httpclient.InferenceServerClient(server.url)
    for index, x in enumerate([0.5, 5.0, 50.0]):
        inp = httpclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([x], dtype=np.float32))
        assert client.infer("custom_metrics", [inp]).as_numpy("COUNT")[0] == index + 1
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert re.search(r'^custom_requests\{model="custom_metrics"\} 3(\.0)?$', text, re.M), text
    assert re.search(r'^custom_last_value\{model="custom_metrics"\} 50(\.0)?$', text, re.M)
    # Bounds as Triton (prometheus-cpp) writes them: le="1", not le="1.0", after the labels.
    assert re.search(r'^custom_x_bucket\{model="custom_metrics",le="1"\} 1(\.0)?$', text, re.M)
    assert re.search(r'^custom_x_bucket\{model="custom_metrics",le="10"\} 2(\.0)?$', text, re.M)
    assert re.search(r'^custom_x_count\{model="custom_metrics"\} 3(\.0)?$', text, re.M)
    client.close()


def test_model_control_from_a_model(server):
    client = httpclient.InferenceServerClient(server.url)
    name = httpclient.InferInput("NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"multi_file"], dtype=np.object_))
    states = client.infer("model_loader", [name]).as_numpy("STATES")
    assert [s.decode() for s in states] == ["False", "True", "False"]
    client.close()
