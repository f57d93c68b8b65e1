"""--rate-limit execution_count: instances run when their rate_limiter resources are free."""

from __future__ import annotations

import concurrent.futures
import itertools
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

#: Sleeps DELAY seconds; answers when its execute started and ended (wall clock).
TIMED = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        delay = float(pb_utils.get_input_tensor_by_name(requests[0], "DELAY").as_numpy()[0])
        time.sleep(delay)
        span = np.array([start, time.time()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def _model(repo: Path, name: str, limiter: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(TIMED)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ {limiter} }} }} ]\n"
    )


def _spans(url: str, calls: list[tuple[str, float]]) -> list[tuple[str, float, float]]:
    """Run every (model, delay) call at once; each call's model, start and end."""

    def one(call: tuple[str, float]) -> tuple[str, float, float]:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            inp = httpclient.InferInput("DELAY", [1], "FP32")
            inp.set_data_from_numpy(np.array([call[1]], dtype=np.float32))
            start, end = client.infer(call[0], [inp]).as_numpy("SPAN").tolist()
            return call[0], start, end
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def _overlap(spans) -> bool:
    ordered = sorted(spans, key=lambda s: s[1])
    return any(b[1] < a[2] for a, b in itertools.pairwise(ordered))


def test_a_shared_resource_keeps_two_models_apart(tmp_path):
    for name in ("a", "b"):
        _model(tmp_path, name, 'resources [ { name: "R1" count: 1 } ]')
    calls = [("a", 0.3), ("b", 0.3)] * 2
    args = ("--rate-limit", "execution_count", "--rate-limit-resource", "R1:1")
    with ShoalServer(tmp_path, extra_args=args) as server:
        spans = _spans(server.url, calls)
        assert not _overlap(spans), spans
    # Without the limiter, the same calls run side by side (each model has its own stub).
    with ShoalServer(tmp_path, extra_args=("--rate-limit", "off")) as server:
        assert _overlap(_spans(server.url, calls))


def test_priority_gives_an_instance_half_the_turns(tmp_path):
    _model(tmp_path, "first", 'resources [ { name: "R1" count: 1 } ] priority: 1')
    _model(tmp_path, "second", 'resources [ { name: "R1" count: 1 } ] priority: 2')
    args = ("--rate-limit", "execution_count")  # R1: the most any instance needs, 1
    with ShoalServer(tmp_path, extra_args=args) as server:
        spans = _spans(server.url, [("first", 0.1), ("second", 0.1)] * 6)
    assert not _overlap(spans)
    order = [name for name, _, _ in sorted(spans, key=lambda s: s[1])]
    last_first = len(order) - 1 - order[::-1].index("first")
    # Weighted by priority, "first" runs about twice as often: its six executions are done
    # while "second" has had about three (alternating turns would give it five).
    assert order[:last_first].count("second") <= 4, order


def test_too_few_copies_fail_the_load_naming_the_resource(tmp_path):
    _model(tmp_path, "greedy", 'resources [ { name: "R1" count: 2 } ]')
    args = (
        "--rate-limit",
        "execution_count",
        "--rate-limit-resource",
        "r1:1",
        "--model-control-mode",
        "explicit",
    )
    with ShoalServer(tmp_path, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("greedy")
        text = str(failed.value)
        assert 'Resource count for "r1" is limited to 1' in text
        assert "the minimum required count is 2 (instance 'greedy_0_0' of model 'greedy'" in text
        client.close()
