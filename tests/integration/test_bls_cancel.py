"""Cancellation reaches BLS calls: a cancelled request cancels the calls its model made, and a
model can cancel its own decoupled call with ``ResponseIterator.cancel()``."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

EXEC, STREAM, ITERATOR_CANCEL, ASYNC_EXEC = 0, 1, 2, 3
MODELS = ("bls_cancel_parent", "cancel_waiter", "decoupled_until_cancel")


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args)) as srv:
        yield srv


def _wait_for_log(server: ShoalServer, line: str, after: int, timeout: float = 30.0) -> str:
    """The log from ``after`` on, once it holds ``line`` (the models report through the log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tail = server.output[after:]
        if line in tail:
            return tail
        time.sleep(0.02)
    raise AssertionError(f"{line!r} not in the log:\n{server.output[after:]}")


def _mode(mode: int) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return [inp]


@pytest.mark.parametrize(
    ("mode", "started", "child_line"),
    [
        (EXEC, "cancel_waiter: started", "cancel_waiter: cancelled=True"),
        (ASYNC_EXEC, "cancel_waiter: started", "cancel_waiter: cancelled=True"),
        (STREAM, "bls_cancel_parent: streaming", "decoupled_until_cancel: cancelled=True"),
    ],
    ids=["exec", "async_exec", "decoupled"],
)
def test_cancelling_a_request_cancels_its_bls_calls(server, mode, started, child_line):
    mark = len(server.output)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    call = client.async_infer(
        "bls_cancel_parent", _mode(mode), callback=lambda result, error: results.put(error)
    )
    _wait_for_log(server, started, mark)
    call.cancel()
    error = results.get(timeout=30)
    assert "CANCELLED" in str(error.status()), error
    # The child saw is_cancelled(), and the parent's BLS wait ended with a CANCELLED error
    # long before the child's own 30 s limit.
    log = _wait_for_log(server, child_line, mark)
    log = _wait_for_log(server, f"bls_cancel_parent: mode={mode} cancelled=True", mark)
    line = next(x for x in log.splitlines() if f"bls_cancel_parent: mode={mode}" in x)
    assert "parent_cancelled=True" in line, line
    assert float(line.rsplit("seconds=", 1)[1]) < 20, line
    client.close()


def test_response_iterator_cancel_ends_the_stream_and_reaches_the_child(server):
    mark = len(server.output)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("bls_cancel_parent", _mode(ITERATOR_CANCEL))
    # Three ticks, maybe a few more already on their way, then the CANCELLED end of the stream.
    assert int(result.as_numpy("COUNT")[0]) >= 4
    log = _wait_for_log(server, "decoupled_until_cancel: cancelled=True", mark)
    assert f"bls_cancel_parent: mode={ITERATOR_CANCEL} cancelled=True" in log, log
    client.close()
