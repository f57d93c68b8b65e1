"""A stub restart that fails for a passing reason is retried, and readiness tells the truth.

The supervisor's file-descriptor limit is lowered under it (``prlimit``) so that starting a new
stub fails with EMFILE, as it did when the attack run exhausted descriptors; the test talks to
the server over one gRPC connection opened before, which needs no new descriptor.
"""

from __future__ import annotations

import os
import resource
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


def _ok_input() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("HANG", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    return inp


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)  # polling the server's health, not waiting on time
    return predicate()


def _index_entry(client: grpcclient.InferenceServerClient, name: str):
    index = client.get_model_repository_index(as_json=True)
    return next(m for m in index["models"] if m["name"] == name)


def test_failed_restart_is_retried_and_readiness_is_false_meanwhile():
    args = ("--model-control-mode", "explicit", "--load-model", "hang")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.infer("hang", [_ok_input()]).as_numpy("OK")[0] == 0
        assert client.is_model_ready("hang") and client.is_server_ready()
        (stub,) = server.stub_pids()
        pid = server.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # No new descriptor for the supervisor: fds 0-2 exist, so every new one is >= 3.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, hard))
        try:
            os.kill(stub, signal.SIGKILL)
            assert _wait(lambda: "restart 2 failed" in server.output, 20), server.output
            assert "Too many open files" in server.output
            assert not client.is_model_ready("hang")
            assert not client.is_server_ready()
            entry = _index_entry(client, "hang")
            assert entry["state"] == "UNAVAILABLE", entry
            assert "no live stub" in entry["reason"], entry
            # A request is refused at once with the reason, instead of waiting for a stub.
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as info:
                client.infer("hang", [_ok_input()], client_timeout=10)
            assert time.monotonic() - started < 5
            assert info.value.status() == "StatusCode.UNAVAILABLE", info.value
            assert "no live instance" in info.value.message()
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        # The cause is gone: the next retry (back-off capped at 5 s) brings the instance back.
        assert _wait(lambda: client.is_model_ready("hang"), 30), server.output
        assert client.is_server_ready()
        assert _index_entry(client, "hang")["state"] == "READY"
        assert client.infer("hang", [_ok_input()]).as_numpy("OK")[0] == 0
        assert len(server.stub_pids()) == 1
        client.close()
        assert server.stop() == 0
