"""A model that is not decoupled answering through ``request.get_response_sender()``, as
Triton's Python backend allows: from another thread after ``execute`` returned None (or a list
with None for that request), and a response sent with FINAL that the model also returns."""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 300000 }}
input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# MODE 0: returned. 1: sent with FINAL before returning None for it. 2: sent from a thread
# 0.3 s after execute returned. 3: sent with FINAL and also returned. 4: no sender, None.
MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _response(value, rows):
    out = pb_utils.Tensor("OUT", np.full((rows, 1), value, dtype=np.int32))
    return pb_utils.InferenceResponse([out])


class TritonPythonModel:
    def execute(self, requests):
        returned, later = [], []
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
            rows, mode = mode.shape[0], int(mode[0][0])
            if mode == 0:
                returned.append(_response(100, rows))
            elif mode == 1:
                request.get_response_sender().send(_response(101, rows), flags=final)
                returned.append(None)
            elif mode == 2:
                later.append((request.get_response_sender(), rows))
                returned.append(None)
            elif mode == 3:
                request.get_response_sender().send(_response(103, rows), flags=final)
                returned.append(_response(999, rows))
            else:
                returned.append(None)

        def send_later():
            time.sleep(0.3)
            for sender, rows in later:
                sender.send(_response(102, rows), flags=final)

        if later:
            threading.Thread(target=send_later, daemon=True).start()
        return None if all(r is None for r in returned) else returned
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo: Path = tmp_path_factory.mktemp("response_sender")
    (repo / "sender" / "1").mkdir(parents=True)
    (repo / "sender" / "config.pbtxt").write_text(CONFIG.format(name="sender"))
    (repo / "sender" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    with ShoalServer(repo) as running:
        yield running


def _infer(server, mode: int) -> int:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("MODE", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[mode]], np.int32))
        return int(client.infer("sender", [tensor]).as_numpy("OUT")[0][0])
    finally:
        client.close()


def test_execute_returns_none_and_a_thread_answers_later(server):
    assert _infer(server, 2) == 102


def test_a_batch_mixing_returned_sent_and_late_responses(server):
    modes = [0, 1, 2, 3]
    with ThreadPoolExecutor(len(modes)) as pool:  # one batch: the batcher waits 0.3 s
        got = list(pool.map(lambda mode: _infer(server, mode), modes))
    assert got == [100, 101, 102, 103]


def test_a_response_sent_with_final_wins_over_the_one_returned(server):
    assert _infer(server, 3) == 103


def test_no_response_and_no_sender_is_an_error_not_a_hang(server):
    with pytest.raises(InferenceServerException, match="sent no response"):
        _infer(server, 4)
    assert _infer(server, 0) == 100  # the instance goes on
