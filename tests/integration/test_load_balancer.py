"""shoal replicas behind a real haproxy: a killed replica costs at most its own in-flight requests,
and a rolling restart (SIGTERM, drain, start) costs none. The full run is benchmarks/replicas.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.haproxy import HAProxy, Load, Replicas, haproxy_binary
from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(180)  # a replica start is seconds on a busy machine

REPLICAS = 2
CONCURRENCY = 4
PER_REPLICA = CONCURRENCY // REPLICAS  # haproxy's maxconn: the most a replica holds in flight
PROGRESS = 150  # requests the load completes between two steps
RUNNING_SECONDS = 5.0  # the request in flight during the drain: time for the checks around it


@pytest.fixture
def haproxy_installed() -> None:
    if haproxy_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("haproxy is required in CI: .ci/run installs it (apt-get install haproxy)")
        pytest.skip("haproxy is not installed (apt-get install -y haproxy)")


def _progress(load: Load, requests: int = PROGRESS, timeout: float = 30.0) -> None:
    """Wait until the load has finished ``requests`` more requests."""
    target = load.count() + requests
    deadline = time.monotonic() + timeout
    while load.count() < target:
        assert time.monotonic() < deadline, f"the load stalled at {load.count()} requests"
        time.sleep(0.01)  # polling the load's progress, not waiting on time


def _up(lb: HAProxy, replicas: Replicas) -> None:
    for name in replicas.servers:
        lb.wait_for(name, "UP")


def test_rolling_restart_under_load_fails_no_request(haproxy_installed):
    with Replicas(REPLICAS) as replicas, HAProxy(replicas.ports) as lb:
        _up(lb, replicas)
        load = Load(lb.url, CONCURRENCY).start()
        try:
            _progress(load)
            for name in list(replicas.servers):
                assert replicas.restart(name, signal.SIGTERM) == 0
                lb.wait_for(name, "UP")
                _progress(load)
        finally:
            result = load.stop()
    assert not result.failed, f"{len(result.failed)} failed, first: {result.failed[:3]}"
    assert len(result.ok) >= PROGRESS * (REPLICAS + 1)


def test_killed_replica_fails_only_its_in_flight_requests(haproxy_installed):
    # No retry on "empty-response": the requests inside the dead replica fail and are counted.
    with (
        Replicas(REPLICAS) as replicas,
        HAProxy(replicas.ports, maxconn=PER_REPLICA, retry_on="conn-failure 503") as lb,
    ):
        _up(lb, replicas)
        load = Load(lb.url, CONCURRENCY).start()
        try:
            _progress(load)
            killed_at = time.monotonic()
            replicas.kill("r0")
            dead_at = time.monotonic()  # reaped: its sockets are closed
            lb.wait_for("r0", "DOWN")
            _progress(load)  # the survivor carries the whole load
        finally:
            result = load.stop()
    # At most maxconn requests are inside r0 at once. A second wave is possible: the kernel keeps
    # a killed process's listening socket until its memory is torn down, and haproxy may send the
    # next requests into that backlog once the first ones fail. Nothing else may fail.
    assert len(result.failed) <= 2 * PER_REPLICA, result.failed
    assert all(start <= dead_at for start, _, _ in result.failed), result.failed
    assert not [e for _, _, e in result.failed if "No server is available" in e], result.failed
    assert sum(1 for _, end in result.ok if end > killed_at) >= PROGRESS - len(result.failed)


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_sigterm_drains_in_flight_and_answers_503_meanwhile():
    """What a load balancer relies on: during the drain the endpoints stay up, health checks and
    new inference get 503 (retry elsewhere), and the request in flight still succeeds."""
    args = ("--model-control-mode", "explicit", "--load-model", "slow")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        seconds = httpclient.InferInput("SECONDS", [1], "FP32")
        seconds.set_data_from_numpy(np.array([RUNNING_SECONDS], dtype=np.float32))
        outcome: dict[str, object] = {}
        caller = threading.Thread(
            target=lambda: outcome.setdefault("answer", client.infer("slow", [seconds]))
        )
        caller.start()
        deadline = time.monotonic() + 20
        while "slow: executing" not in server.output:
            assert time.monotonic() < deadline, server.output
            time.sleep(0.01)  # polling the log for the model's own line, not waiting on time
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        while "shutting down" not in server.output:
            assert time.monotonic() < deadline, server.output
            time.sleep(0.01)  # polling the log for the drain's start
        base = f"http://{server.url}/v2"
        for path in ("/health/ready", "/health/live"):
            status, body = _status(base + path)
            assert (status, json.loads(body)) == (503, {"error": "Server exiting"})
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException, match="Server exiting"):
            grpc.is_server_ready()
        grpc.close()
        refused = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as info:
            refused.infer("slow", [seconds])
        assert info.value.status() == "503"
        assert "shutting down" in str(info.value) and "'slow'" in str(info.value)
        refused.close()
        caller.join(20)
        answer = outcome["answer"]
        assert isinstance(answer, httpclient.InferResult)
        np.testing.assert_array_equal(answer.as_numpy("SECONDS_OUT"), [RUNNING_SECONDS])
        # The drain ends on its own (a second SIGTERM from stop() would cut it short).
        assert server.proc.wait(30) == 0
        assert server.stop() == 0
        client.close()
