"""A reload that changes only a model's instance groups updates its instances in place, as
Triton's does: the kept instances serve on with their state (no second ``initialize``), only
the added ones start and only the removed ones finalize, and no request fails during it. Any
other change (the configuration elsewhere, a file of the version) still loads the model anew."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(240)

_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Beside the model's directory: a file in it would be a change of the model.
        self._events = os.path.join(os.path.dirname(args["model_repository"]), "events.txt")
        self._served = 0
        self._note("initialize")

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            time.sleep(float(delay[0]))
            self._served += 1
            outputs = [
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("SERVED", np.array([self._served], dtype=np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses

    def finalize(self):
        self._note("finalize")

    def _note(self, what):
        with open(self._events, "a") as f:
            f.write(f"{what} {os.getpid()}\\n")
"""

_CONFIG = """
name: "counted"
backend: "python"
max_batch_size: 0
input [ {{ name: "DELAY", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }} ]
output [ {{ name: "SERVED", data_type: TYPE_INT64, dims: [ 1 ] }} ]
instance_group [ {groups} ]
{extra}
"""


def _write_config(model: Path, groups: str, extra: str = "") -> None:
    (model / "config.pbtxt").write_text(_CONFIG.format(groups=groups, extra=extra))


def _cpu(count: int) -> str:
    return f"{{ count: {count}, kind: KIND_CPU }}"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    directory = tmp_path / "repo" / "counted"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(_MODEL)
    _write_config(directory, _cpu(1))
    return directory


def _events(model: Path) -> list[tuple[str, int]]:
    path = model.parent / "events.txt"
    lines = path.read_text().split() if path.exists() else []
    return [(lines[i], int(lines[i + 1])) for i in range(0, len(lines), 2)]


def _pids(model: Path, what: str) -> list[int]:
    return [pid for event, pid in _events(model) if event == what]


def _infer(client: httpclient.InferenceServerClient, delay: float = 0.0) -> tuple[int, int]:
    """(pid, requests that instance has served) of one request."""
    tensor = httpclient.InferInput("DELAY", [1], "FP32")
    tensor.set_data_from_numpy(np.array([delay], dtype=np.float32))
    result = client.infer("counted", [tensor])
    return int(result.as_numpy("PID")[0]), int(result.as_numpy("SERVED")[0])


@contextmanager
def _steady_requests(server: ShoalServer, clients: int = 3) -> Iterator[list[tuple[int, int]]]:
    """Clients sending requests back to back for as long as the block runs; afterwards the
    answers they got (the block's caller checks them). Any failed request fails the test."""
    answers: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def send() -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            while not stop.is_set():
                answers.append(_infer(client, 0.02))
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, f"requests failed during the reload: {errors[0]!r}"


def _serve(model: Path) -> ShoalServer:
    args = ("--model-control-mode", "explicit", "--load-model", "counted")
    return ShoalServer(model.parent, extra_args=args)


def _answering(server: ShoalServer, count: int) -> dict[int, int]:
    """Each instance's pid, with the most requests it had served, once ``count`` different
    instances have answered (slow requests in parallel, so that each instance takes some)."""
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while len(seen) < count:
        assert time.monotonic() < deadline, f"only {len(seen)} instance(s) answered: {seen}"
        results: list[tuple[int, int]] = []

        def one(results: list[tuple[int, int]]) -> None:
            client = httpclient.InferenceServerClient(server.url)
            try:
                results.append(_infer(client, 0.2))
            finally:
                client.close()

        threads = [threading.Thread(target=one, args=(results,)) for _ in range(count * 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for pid, served in results:
            seen[pid] = max(seen.get(pid, 0), served)
    return seen


def test_adding_an_instance_keeps_the_serving_one(model: Path) -> None:
    with _serve(model) as server:
        client = httpclient.InferenceServerClient(server.url)
        for _ in range(3):
            first, served = _infer(client)
        assert served == 3
        with _steady_requests(server) as answers:
            _write_config(model, _cpu(2))
            client.load_model("counted")
            assert client.is_model_ready("counted")
            _answering(server, 2)
        assert answers, "no request was answered during the reload"
        # One more initialize (the new instance's), no finalize; the first stub is the same
        # process with the same state: its count of requests went on.
        assert _pids(model, "initialize")[0] == first
        assert len(_pids(model, "initialize")) == 2 and _pids(model, "finalize") == []
        assert first in server.stub_pids()
        assert max(s for pid, s in answers if pid == first) > 3
        assert client.get_model_config("counted")["instance_group"][0]["count"] == 2
        client.close()
        assert server.stop() == 0
    assert len(_pids(model, "finalize")) == 2


def test_removing_an_instance_finalizes_only_it(model: Path) -> None:
    _write_config(model, _cpu(3))
    with _serve(model) as server:
        client = httpclient.InferenceServerClient(server.url)
        before = _answering(server, 3)
        with _steady_requests(server) as answers:
            _write_config(model, _cpu(2))
            client.load_model("counted")
            # The removed instance finalized before the load answered (Triton's too).
            assert len(_pids(model, "finalize")) == 1
        assert answers
        (gone,) = _pids(model, "finalize")
        assert gone in before and gone not in server.stub_pids()
        assert len(_pids(model, "initialize")) == 3
        after = _answering(server, 2)
        assert set(after) == set(before) - {gone}
        assert all(after[pid] > before[pid] for pid in after), "an instance lost its state"
        client.close()


@pytest.mark.parametrize("change", ["config", "version file", "model directory file"])
def test_any_other_change_reloads_every_instance(model: Path, change: str) -> None:
    _write_config(model, _cpu(2))
    (model / "helper.py").write_text("# a module model.py could import\n")
    with _serve(model) as server:
        client = httpclient.InferenceServerClient(server.url)
        before = _answering(server, 2)
        if change == "config":
            _write_config(model, _cpu(3), 'parameters { key: "k" value { string_value: "v" } }')
        else:
            changed = model / ("1/model.py" if change == "version file" else "helper.py")
            with open(changed, "a") as file:
                file.write("\n# changed\n")
            _write_config(model, _cpu(3))
        client.load_model("counted")
        assert len(_pids(model, "initialize")) == 5
        deadline = time.monotonic() + 30
        while len(_pids(model, "finalize")) < 2:
            assert time.monotonic() < deadline, _events(model)
            time.sleep(0.05)  # polling the model's own record of its finalize calls
        assert set(_pids(model, "finalize")) == set(before)
        assert not set(_answering(server, 3)) & set(before)
        client.close()
