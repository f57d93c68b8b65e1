"""A lone instance behind the default scheduler gets requests sent ahead into its stub's ring
(``SEND_AHEAD`` of them) while it runs one. What a client and the statistics see must not change:
time in the ring counts as queue time, and requests sent ahead survive their stub's crash."""

from __future__ import annotations

import json
import re
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.supervisor.instances.instance import SEND_AHEAD
from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

CONFIG = """
name: "lone"
backend: "python"
max_batch_size: 0
input [
  { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CRASH_AFTER" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# CRASH_AFTER names a directory: the model writes "started" there, waits for "go", then dies.
MODEL = textwrap.dedent(
    """
    import os, signal, time
    from pathlib import Path

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                crash = pb_utils.get_input_tensor_by_name(request, "CRASH_AFTER")
                if crash is not None:
                    folder = Path(crash.as_numpy()[0].decode())
                    (folder / "started").touch()
                    deadline = time.monotonic() + 30
                    while not (folder / "go").exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGKILL)
                seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
                time.sleep(float(seconds[0]))
                pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
                responses.append(pb_utils.InferenceResponse(output_tensors=[pid]))
            return responses
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    (repo / "lone" / "1").mkdir(parents=True)
    (repo / "lone" / "config.pbtxt").write_text(CONFIG)
    (repo / "lone" / "1" / "model.py").write_text(MODEL)
    with ShoalServer(repo, metrics=True, extra_args=("--trace-overhead",)) as srv:
        yield srv


def _infer(server: ShoalServer, seconds: float, crash_after: Path | None = None) -> int:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    inputs = [httpclient.InferInput("SECONDS", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([seconds], dtype=np.float32))
    if crash_after is not None:
        inputs.append(httpclient.InferInput("CRASH_AFTER", [1], "BYTES"))
        inputs[1].set_data_from_numpy(np.array([str(crash_after).encode()], dtype=np.object_))
    try:
        return int(client.infer("lone", inputs).as_numpy("PID")[0])
    finally:
        client.close()


def _queue_stats(server: ShoalServer) -> tuple[int, int]:
    """(successful requests, their total queue time in ns) of the statistics extension."""
    with urllib.request.urlopen(f"http://{server.url}/v2/models/lone/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]["inference_stats"]
    return stats["success"]["count"], stats["queue"]["ns"]


def _staged(server: ShoalServer) -> int:
    """Requests for "lone" the core has taken in so far (--trace-overhead's stage counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(
        r'shoal_request_stage_count\{[^}]*model="lone"[^}]*stage="stage"[^}]*\} (\S+)', text
    )
    return int(float(found.group(1))) if found else 0


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_send_ahead_is_deeper_than_one():
    assert SEND_AHEAD >= 2  # the tests below would not put requests in the ring otherwise


def test_queue_time_counts_the_wait_in_the_stubs_ring(server):
    count_before, queue_before = _queue_stats(server)
    step = 0.3
    with ThreadPoolExecutor(4) as pool:
        pids = list(pool.map(lambda _: _infer(server, step), range(4)))
    assert len(set(pids)) == 1  # one instance ran them one after the other
    count, queue_ns = _queue_stats(server)
    assert count - count_before == 4
    # Three waited behind one, two, three runs of 0.3 s: in the stub's ring, mostly, since up
    # to SEND_AHEAD requests are sent ahead. At least 1.8 s of queueing in all.
    assert (queue_ns - queue_before) / 1e9 >= (1 + 2 + 3) * step * 0.9


def test_requests_sent_ahead_survive_their_stubs_crash(server, tmp_path):
    first_pid = _infer(server, 0.0)
    with ThreadPoolExecutor(4) as pool:
        crashing = pool.submit(_infer, server, 0.0, tmp_path)
        _wait_for(lambda: (tmp_path / "started").exists(), "the crashing request to start")
        staged = _staged(server)
        others = [pool.submit(_infer, server, 0.0) for _ in range(SEND_AHEAD)]
        # Every other request has reached the core (and, the stub being busy, its ring).
        _wait_for(lambda: _staged(server) >= staged + SEND_AHEAD, "the others to arrive")
        (tmp_path / "go").touch()
        with pytest.raises(InferenceServerException) as failure:
            crashing.result(timeout=60)
        pids = {future.result(timeout=60) for future in others}
    assert "lone" in str(failure.value)
    # The requests that had not started went back to the queue and ran on the restarted stub.
    assert len(pids) == 1 and first_pid not in pids
