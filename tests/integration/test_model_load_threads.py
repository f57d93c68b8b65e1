"""``--model-load-thread-count``: how many of the repository's models start at once.

Each model's ``initialize`` marks its start in a shared directory and records how many models
had started and not yet finished while it ran, so the bound is read from the models' own view.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
parameters {{ key: "marks" value {{ string_value: "{marks}" }} }}
parameters {{ key: "wait_for" value {{ string_value: "{wait_for}" }} }}
"""

# Waits (bounded) until `wait_for` models have started, or 1.5 s when it is 0, and records what
# it saw.
MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        marks = params["marks"]["string_value"]
        wait_for = int(params["wait_for"]["string_value"])
        name = args["model_name"]
        open(os.path.join(marks, name + ".start"), "w").close()

        def count(suffix):
            return sum(1 for n in os.listdir(marks) if n.endswith(suffix))

        # Waiting: how many had started while this one ran; else the most running at once.
        seen = 0
        deadline = time.monotonic() + (30.0 if wait_for else 1.5)
        while time.monotonic() < deadline:
            if wait_for:
                seen = count(".start")
                if seen >= wait_for:
                    break
            else:
                seen = max(seen, count(".start") - count(".end"))
            time.sleep(0.05)
        with open(os.path.join(marks, name + ".seen"), "w") as f:
            f.write(str(seen))
        open(os.path.join(marks, name + ".end"), "w").close()

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]
"""


def _repository(root: Path, models: int, wait_for: int) -> tuple[Path, Path]:
    repo, marks = root / "repo", root / "marks"
    marks.mkdir()
    for index in range(models):
        name = f"m{index}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, marks=marks, wait_for=wait_for)
        )
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    return repo, marks


def _seen(marks: Path, models: int) -> list[int]:
    return [int((marks / f"m{index}.seen").read_text()) for index in range(models)]


def test_one_load_thread_starts_the_models_one_at_a_time(tmp_path: Path) -> None:
    repo, marks = _repository(tmp_path, models=3, wait_for=0)
    with ShoalServer(repo, extra_args=("--model-load-thread-count", "1"), timeout=120):
        pass
    assert _seen(marks, 3) == [1, 1, 1]


def test_models_start_together_up_to_the_thread_count(tmp_path: Path) -> None:
    # Each model waits until three have started: they can finish only if three start at once.
    repo, marks = _repository(tmp_path, models=3, wait_for=3)
    with ShoalServer(repo, extra_args=("--model-load-thread-count", "3"), timeout=120):
        pass
    assert _seen(marks, 3) == [3, 3, 3]


LOADS_Z = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.load_model(model_name="z")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]
"""


def test_a_model_loading_another_in_initialize_does_not_wait_for_a_slot(tmp_path: Path) -> None:
    # 'a' holds the only slot while its initialize loads 'z', whose own start-up load waits for
    # that slot: the load 'a' asked for must not wait behind it.
    repo, marks = _repository(tmp_path, models=0, wait_for=0)
    for name, source in (
        ("a", LOADS_Z),
        ("z", LOADS_Z.replace('pb_utils.load_model(model_name="z")', "pass")),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, marks=marks, wait_for=0))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    flags = (
        "--model-load-thread-count",
        "1",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )
    with ShoalServer(repo, extra_args=flags, timeout=90) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("a") and client.is_model_ready("z")
        client.close()
