"""A model's own ``is_ready()`` (Triton's user-defined model readiness) decides its readiness
on both protocols; inference is unaffected."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
parameters {{ key: "ANSWER" value: {{ string_value: "{answer}" }} }}
"""

MODEL = """
import asyncio
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.answer = config["parameters"]["ANSWER"]["string_value"]

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]

    def is_ready(self):
        if self.answer == "slow":
            time.sleep(6)
            return True
        if self.answer == "raises":
            raise RuntimeError("not today")
        if self.answer == "coroutine":
            return self._later()
        return {"true": True, "false": False}.get(self.answer, "ready")

    async def _later(self):
        await asyncio.sleep(0.01)
        return True
"""

ANSWERS = {
    "says_true": "true",
    "says_false": "false",
    "raises": "raises",
    "no_bool": "not a bool",
    "coroutine": "coroutine",
    "slow": "slow",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo: Path = tmp_path_factory.mktemp("user_readiness")
    for name, answer in ANSWERS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, answer=answer))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    # Not strict: a model saying it is not ready must not make the server not ready.
    with ShoalServer(repo, extra_args=("--strict-readiness", "false")) as running:
        yield running


def _both_say(server, name: str) -> tuple[bool, bool]:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return http.is_model_ready(name), grpc.is_model_ready(name)
    finally:
        http.close()
        grpc.close()


def _infers(server, name: str) -> bool:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2.0], np.float32))
        return float(client.infer(name, [tensor]).as_numpy("OUT")[0]) == 2.0
    finally:
        client.close()


@pytest.mark.parametrize(
    ("name", "ready"),
    [
        ("says_true", True),
        ("coroutine", True),
        ("says_false", False),
        ("raises", False),
        ("no_bool", False),
    ],
)
def test_is_ready_decides_model_readiness_and_inference_goes_on(server, name, ready):
    for _ in range(3):
        assert _both_say(server, name) == (ready, ready)
        assert _infers(server, name)


def test_a_slow_is_ready_times_out_and_the_next_call_joins_it(server):
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert not http.is_model_ready("slow")  # 5 s without an answer: not ready
        assert _infers(server, "slow")  # is_ready() still runs, execute is not held up
        assert grpc.is_model_ready("slow")  # joins the check in flight: its answer
    finally:
        http.close()
        grpc.close()
