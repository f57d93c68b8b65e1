"""What a model's process looks like from inside: argv, and the module names Triton's own
Python backend provides (models written for Triton import them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

# argparse and unittest.main() read sys.argv: in Triton's stub it is [""], never the stub's flags.
INSPECT = """
import argparse
import json
import sys
import unittest

import c_python_backend_utils as c_utils
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.parsed = vars(argparse.ArgumentParser().parse_known_args()[0])
        self.unittest_ran = unittest.main("model", exit=False).result.wasSuccessful()

    def execute(self, requests):
        facts = {
            "argv": sys.argv,
            "parsed": self.parsed,
            "unittest_ran": self.unittest_ran,
            "same_classes": c_utils.Tensor is pb_utils.Tensor
            and c_utils.InferenceResponse is pb_utils.InferenceResponse,
            "free_memory": c_utils.shared_memory.free_memory(),
        }
        out = np.array([json.dumps(facts).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


def _write_model(repo: Path, name: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))


def _facts(client: httpclient.InferenceServerClient, model: str) -> dict:
    inp = httpclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return json.loads(client.infer(model, [inp]).as_numpy("OUT")[0])


def test_a_model_sees_an_argv_of_its_own_and_triton_native_module(tmp_path: Path) -> None:
    _write_model(tmp_path, "inspect", INSPECT)
    with ShoalServer(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        facts = _facts(client, "inspect")
        assert facts["argv"] == [""]
        assert facts["parsed"] == {}
        assert facts["unittest_ran"] is True
        assert facts["same_classes"] is True
        # The output arena is empty when execute starts: the same figure on every call, and
        # after a restart (Triton's restart QA compares it).
        assert facts["free_memory"] > 0
        assert _facts(client, "inspect")["free_memory"] == facts["free_memory"]
        client.close()
        assert server.stop() == 0


INIT_EXIT = """
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, requests):
        return None
"""


def test_a_stub_killed_in_initialize_is_reported_in_tritons_words(tmp_path: Path) -> None:
    _write_model(tmp_path, "init_exit", INIT_EXIT)
    with ShoalServer(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert not client.is_model_ready("init_exit")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        reason = index["init_exit"]["reason"]
        assert "Stub process 'init_exit_0' is not healthy." in reason, reason
        assert "SIGKILL" in reason
        client.close()
        server.stop()
        assert "Stub process 'init_exit_0' is not healthy." in server.output
