"""``--busy-poll-us``: the core and the workers poll for answers after sending work out, the
answers do not change, and an idle server burns no CPU (its loops stop polling)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, ShoalServer, command_lines

pytestmark = pytest.mark.timeout(120)

#: CPU seconds a process may use in the idle window: a loop that kept polling would use most of
#: a core's share of it (the window is 2 s), an idle one a few milliseconds.
IDLE_CPU_LIMIT_S = 0.25
IDLE_WINDOW_S = 2.0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _serving_pids(server: ShoalServer) -> list[int]:
    """The core and its frontend workers (not the stubs: they spin on their own rings)."""
    assert server.proc is not None
    core = server.proc.pid
    pids = [core]
    for pid, args in command_lines():
        if any(b"worker_main" in a for a in args) and str(core).encode() in args:
            pids.append(pid)
    return pids


def _identity(module, data: np.ndarray) -> list:
    tensor = module.InferInput("IN_FP32", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_forced_busy_poll_answers_the_same_and_an_idle_server_stays_idle(workers: str):
    args = ("--busy-poll-us", "1000", "--frontend-workers", workers)
    with ShoalServer(BUNDLED, extra_args=args) as server:
        assert "busy poll: up to 1000" in server.output, server.output
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for i in range(50):
            data = np.arange(16, dtype=np.float32) + i
            for client, module in ((http, httpclient), (grpc, grpcclient)):
                result = client.infer("identity", _identity(module, data))
                np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
        http.close()
        grpc.close()
        pids = _serving_pids(server)
        assert len(pids) == (1 if workers == "1" else 3), pids
        before = {pid: _cpu_seconds(pid) for pid in pids}
        time.sleep(IDLE_WINDOW_S)  # the window over which idle CPU is measured, not a wait
        used = {pid: _cpu_seconds(pid) - before[pid] for pid in pids}
        assert all(cpu < IDLE_CPU_LIMIT_S for cpu in used.values()), used


def test_busy_poll_flag_rejects_nonsense():
    from shoal.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--model-repository", str(BUNDLED), "--busy-poll-us", "-5"])
