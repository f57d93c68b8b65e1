"""Cancellation reaches BLS calls: a cancelled request cancels the calls its model made, and a
model can cancel its own decoupled call with ``ResponseIterator.cancel()``."""

from __future__ import annotations

import json
import queue
import re
import socket
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


def _wait_for_count(server: ShoalServer, line: str, count: int, after: int) -> str:
    """The log from ``after`` on, once ``line`` is in it ``count`` times."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tail = server.output[after:]
        if tail.count(line) >= count:
            return tail
        time.sleep(0.02)
    raise AssertionError(f"{line!r} not {count} times in the log:\n{server.output[after:]}")


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
    seconds = re.search(r"seconds=([\d.]+)", line)  # the line's message is a JSON string
    assert seconds and float(seconds.group(1)) < 20, line
    client.close()


def test_response_iterator_cancel_ends_the_stream_and_reaches_the_child(server):
    mark = len(server.output)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("bls_cancel_parent", _mode(ITERATOR_CANCEL))
    # Three ticks, maybe a few more already on their way, then the CANCELLED end of the stream.
    assert int(result.as_numpy("COUNT")[0]) >= 4
    _wait_for_log(server, "decoupled_until_cancel: cancelled=True", mark)
    # The parent's log line travels apart from its response: it may come after the answer.
    _wait_for_log(server, f"bls_cancel_parent: mode={ITERATOR_CANCEL} cancelled=True", mark)
    client.close()


def test_a_queued_bls_call_of_a_cancelled_request_never_runs(server):
    mark = len(server.output)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()

    def call(request_id):
        return client.async_infer(
            "bls_cancel_parent",
            _mode(EXEC),
            callback=lambda result, error: results.put(error),
            request_id=request_id,
        )

    first = call("first")  # its child call runs on the one instance of cancel_waiter
    _wait_for_log(server, "cancel_waiter: started id=first", mark)
    second = call("second")  # its child call waits in cancel_waiter's queue
    _wait_for_count(server, "bls_cancel_parent: calling mode=0", 2, mark)
    second.cancel()
    done = f"bls_cancel_parent: mode={EXEC} cancelled=True"
    _wait_for_log(server, done, mark)  # the second returned while the first still runs
    first.cancel()
    _wait_for_count(server, done, 2, mark)
    # Had the dropped call run, it would come before this one in cancel_waiter's FIFO queue.
    third = call("third")
    _wait_for_log(server, "cancel_waiter: started id=third", mark)
    third.cancel()
    log = _wait_for_count(server, done, 3, mark)
    assert "started id=second" not in log, log
    for _ in range(3):
        assert "CANCELLED" in str(results.get(timeout=30).status())
    client.close()


def test_an_http_client_going_away_cancels_the_bls_calls_of_its_generate_request(server):
    mark = len(server.output)
    host, port = server.url.split(":")
    body = json.dumps({"MODE": EXEC}).encode()
    head = (
        "POST /v2/models/bls_cancel_parent/generate HTTP/1.1\r\n"
        f"Host: {server.url}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head + body)
        _wait_for_log(server, "cancel_waiter: started", mark)
    _wait_for_log(server, "cancel_waiter: cancelled=True", mark)
    _wait_for_log(server, f"bls_cancel_parent: mode={EXEC} cancelled=True", mark)
