"""Stub crashes, restarts and a clean shutdown that leaves nothing behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import shoal_shm_segments
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(180)


def _crash_input(value: int):
    inp = httpclient.InferInput("CRASH", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return inp


def _pid_of_answer(client) -> int:
    return int(client.infer("crasher", [_crash_input(0)]).as_numpy("PID")[0])


def test_stub_crash_fails_its_request_and_instance_restarts():
    with ShoalServer(TEST_MODELS) as server:
        client = httpclient.InferenceServerClient(server.url)
        for _ in range(20):
            _pid_of_answer(client)
        fds_before = _fd_count(server.proc.pid)
        before = server.stub_pids()
        with pytest.raises(InferenceServerException) as info:
            client.infer("crasher", [_crash_input(1)])
        text = str(info.value)
        assert "crasher_0_" in text and "SIGKILL" in text, text
        # Later requests succeed: the other instance serves while the dead one restarts.
        for _ in range(10):
            assert _pid_of_answer(client) > 0
        _wait_for_stub_count(server, len(before))
        pids = server.stub_pids()
        assert len(pids) == len(before), "the crashed instance was not restarted"
        assert len(pids - before) == 1
        for _ in range(2):  # two more crashes and restarts
            with pytest.raises(InferenceServerException):
                client.infer("crasher", [_crash_input(1)])
            _wait_for_stub_count(server, len(before))
        for _ in range(200):
            _pid_of_answer(client)
        # A dead stub's channel, socket, pipes, pidfd and mappings are all closed: three
        # restarts leak nothing. (+1: output segments are mapped lazily, on first use.)
        assert _fd_count(server.proc.pid) <= fds_before + 1
        client.close()
        assert server.stop() == 0


def test_shutdown_drains_in_flight_and_calls_finalize():
    segments_before = shoal_shm_segments()
    server = ShoalServer(TEST_MODELS).start()
    try:
        client = httpclient.InferenceServerClient(server.url)
        caller, outcome = _slow_call_in_flight(server, client, 1.0)
        stubs = server.stub_pids()
        assert stubs
        assert server.stop(signal.SIGTERM) == 0
        caller.join(10)
        assert "error" not in outcome, outcome.get("error")
        np.testing.assert_array_equal(outcome["result"].as_numpy("SECONDS_OUT"), [1.0])
        assert "slow: finalize called" in server.output
        # A stub's own stdout and stderr reach the server log, tagged with the instance.
        assert "[slow_0] slow: hello from stdout" in server.output
        assert "[slow_0] slow: hello from stderr" in server.output
        for pid in stubs:
            assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
        client.close()
    finally:
        if server.proc and server.proc.poll() is None:
            server.stop()
        server.__exit__(None, None, None)
    assert shoal_shm_segments() == segments_before


@pytest.mark.timeout(60)
def test_second_signal_stops_at_once():
    """SIGTERM starts the drain of a 20 s request; a second SIGTERM ends it at once: the server
    exits 1 within seconds, its stubs are gone and nothing is left in /dev/shm."""
    segments_before = shoal_shm_segments()
    server = ShoalServer(TEST_MODELS).start()
    try:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        caller, outcome = _slow_call_in_flight(server, client, 20.0)
        stubs = server.stub_pids()
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while "shutting down" not in server.output and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the log: the drain has begun
        assert server.proc.poll() is None, "the first signal must drain, not exit"
        started = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=10) == 1
        assert time.monotonic() - started < 5
        assert "stopping at once" in server.output
        caller.join(10)
        assert "result" not in outcome
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in stubs) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the process table: SIGKILL is delivered asynchronously
        assert not [pid for pid in stubs if _alive(pid)]
        client.close()
    finally:
        if server.proc and server.proc.poll() is None:
            server.stop()
        server.__exit__(None, None, None)
    assert shoal_shm_segments() == segments_before


def _slow_call_in_flight(
    server: ShoalServer, client: httpclient.InferenceServerClient, seconds: float
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a call to the slow model in a thread and return once the model is executing it;
    ``outcome`` gets its "result" (the InferResult) or its "error"."""
    inp = httpclient.InferInput("SECONDS", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = client.infer("slow", [inp])
        except Exception as error:  # recorded and asserted by the caller
            outcome["error"] = error

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 20
    while "slow: executing" not in server.output and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the log for the model's own line, not waiting on time
    assert "slow: executing" in server.output
    return caller, outcome


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}") and not _is_zombie(pid)


def _wait_for_stub_count(server, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(server.stub_pids()) != count and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the process table for the restarted stub


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_bundled_server_starts_and_stops_cleanly():
    with ShoalServer(BUNDLED) as server:
        assert len(server.stub_pids()) == 3
        assert server.stop(signal.SIGINT) == 0


def test_supervisor_killed_takes_its_stubs_with_it():
    segments_before = shoal_shm_segments()
    server = ShoalServer(BUNDLED).start()
    try:
        stubs = server.stub_pids()
        assert stubs
        server.proc.kill()  # SIGKILL: no cleanup code runs in the supervisor
        server.proc.wait(10)
        deadline = time.monotonic() + 5
        while any(not _is_zombie(p) and os.path.exists(f"/proc/{p}") for p in stubs):
            assert time.monotonic() < deadline, "stubs outlived their supervisor"
            time.sleep(0.01)  # polling the process table
        # memfd arenas vanish with their last process: no named segment is left.
        assert shoal_shm_segments() == segments_before
    finally:
        server.__exit__(None, None, None)


def _int32(name: str, value: int):
    inp = httpclient.InferInput(name, [1], "INT32")
    inp.set_data_from_numpy(np.array([value], dtype=np.int32))
    return inp


def test_execute_timeout_kills_a_stuck_stub_and_it_comes_back():
    args = ("--model-control-mode", "explicit", "--load-model", "hang")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException, match="did not finish within 1s"):
            client.infer("hang", [_int32("HANG", 1)])
        assert int(client.infer("hang", [_int32("HANG", 0)]).as_numpy("OK")[0]) == 0
        client.close()


def test_crash_loop_makes_the_model_unavailable_with_the_reason():
    args = ("--model-control-mode", "explicit", "--load-model", "crash_always")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        for _ in range(5):
            with pytest.raises(InferenceServerException) as info:
                client.infer("crash_always", [_int32("IN", 1)])
            # Triton's words first (its QA and log scrapers look for them), then why.
            assert "Stub process 'crash_always_0' is not healthy. It died with exit code 3" in (
                str(info.value)
            )
        assert not client.is_model_ready("crash_always")
        assert not client.is_server_ready()
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert "crash loop" in index["crash_always"]["reason"]
        assert "exit code 3" in index["crash_always"]["reason"]
        client.close()
