"""The response cache: --cache-config local,size=N and response_cache { enable: true }."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

#: OUT = 2 * IN; CALLS counts this instance's executions, so a cached answer shows an old count.
COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            calls = np.array([self.calls], dtype=np.int64)
            outputs = [pb_utils.Tensor("OUT", x * 2), pb_utils.Tensor("CALLS", calls)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

#: One entry with a 256-float output is about 1.4 kB: two fit, a third evicts the oldest.
CACHE_BYTES = 3000


def _model(repo: Path, name: str, extra: str = "", source: str = COUNTER) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{CONFIG}{extra}')


def _infer(client, model: str, values, outputs=None):
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    data = np.asarray(values, dtype=np.float32)
    inp = module.InferInput("IN", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    result = client.infer(model, [inp], outputs=requested)
    calls = result.as_numpy("CALLS")
    return result.as_numpy("OUT"), None if calls is None else int(calls[0])


def _stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "cached", "response_cache { enable: true }\n")
    _model(repo, "plain")
    args = ("--cache-config", f"local,size={CACHE_BYTES}")
    with ShoalServer(repo, extra_args=args, metrics=True) as server:
        yield server


def test_a_repeated_request_is_answered_from_the_cache(cached_server):
    http = httpclient.InferenceServerClient(cached_server.url)
    grpc = grpcclient.InferenceServerClient(cached_server.grpc_url)
    out, first = _infer(http, "cached", [1, 2, 3])
    assert out.tolist() == [2, 4, 6]
    # The same inputs from either protocol: the model does not run again.
    assert _infer(http, "cached", [1, 2, 3])[1] == first
    out, calls = _infer(grpc, "cached", [1, 2, 3])
    assert out.tolist() == [2, 4, 6] and calls == first
    # Other data, another shape, fewer requested outputs: each is a miss that runs the model.
    assert _infer(http, "cached", [1, 2, 4])[1] == first + 1
    assert _infer(http, "cached", [1, 2, 3, 0])[1] == first + 2
    assert _infer(http, "cached", [1, 2, 3], outputs=["OUT"])[0].tolist() == [2, 4, 6]
    stats = _stats(http, "cached")
    infer = stats["inference_stats"]
    assert infer["success"]["count"] == 6
    assert infer["cache_hit"]["count"] == 2 and infer["cache_hit"]["ns"] > 0
    assert infer["cache_miss"]["count"] == 4 and infer["cache_miss"]["ns"] > 0
    # Triton's accounting: a hit is neither an inference nor an execution.
    assert stats["inference_count"] == 4 and stats["execution_count"] == 4
    assert infer["compute_infer"]["count"] == 4 and infer["queue"]["count"] == 6
    # A model without response_cache is never cached.
    calls = [_infer(grpc, "plain", [1, 2, 3])[1] for _ in range(2)]
    assert calls[1] == calls[0] + 1
    assert _stats(http, "plain")["inference_stats"]["cache_miss"]["count"] == 0
    http.close()
    grpc.close()


def test_the_cache_is_bounded_and_evicts_the_least_recently_used(cached_server):
    client = httpclient.InferenceServerClient(cached_server.url)
    a, b, c = (np.full(256, v, dtype=np.float32) for v in (7, 8, 9))
    calls_a = _infer(client, "cached", a)[1]
    calls_b = _infer(client, "cached", b)[1]
    assert calls_b == calls_a + 1
    assert _infer(client, "cached", a)[1] == calls_a  # a hit: a is now the most recent
    calls_c = _infer(client, "cached", c)[1]  # evicts b
    assert _infer(client, "cached", a)[1] == calls_a
    assert _infer(client, "cached", c)[1] == calls_c
    assert _infer(client, "cached", b)[1] > calls_c  # b was evicted: it runs again
    # A response larger than the whole cache is answered and not kept.
    big = np.ones(1024, dtype=np.float32)
    first = _infer(client, "cached", big)[1]
    assert _infer(client, "cached", big)[1] == first + 1
    assert "larger than the response cache" in cached_server.output
    client.close()


def test_metrics_are_triton_s_per_model_cache_counters(cached_server):
    client = httpclient.InferenceServerClient(cached_server.url)
    _infer(client, "cached", [5])
    _infer(client, "cached", [5])
    stats = _stats(client, "cached")["inference_stats"]
    url = f"http://127.0.0.1:{cached_server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    lines = {
        line.split(" ")[0]: int(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("nv_cache_")
    }
    labels = '{model="cached",version="1"}'
    assert lines[f"nv_cache_num_hits_per_model{labels}"] == stats["cache_hit"]["count"]
    assert lines[f"nv_cache_num_misses_per_model{labels}"] == stats["cache_miss"]["count"]
    assert lines[f"nv_cache_hit_duration_per_model{labels}"] == stats["cache_hit"]["ns"] // 1000
    assert lines[f"nv_cache_miss_duration_per_model{labels}"] == stats["cache_miss"]["ns"] // 1000
    assert not any('model="plain"' in name for name in lines)  # only models that use the cache
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    client.close()


def test_without_a_server_cache_nothing_is_cached_and_decoupled_models_refuse_it(tmp_path):
    _model(tmp_path, "cached", "response_cache { enable: true }\n")
    decoupled = "response_cache { enable: true }\nmodel_transaction_policy { decoupled: true }\n"
    _model(tmp_path, "streaming", decoupled)
    with ShoalServer(tmp_path) as server:  # no --cache-config: the model loads, uncached
        client = httpclient.InferenceServerClient(server.url)
        calls = [_infer(client, "cached", [1])[1] for _ in range(2)]
        assert calls[1] == calls[0] + 1
        assert client.is_model_ready("streaming")
        client.close()
    args = ("--cache-config", "local,size=1048576", "--model-control-mode", "explicit")
    with ShoalServer(tmp_path, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("streaming")
        assert "Response Cache does not currently support model 'streaming'" in str(failed.value)
        assert "'decoupled' transaction policy" in str(failed.value)
        client.close()
