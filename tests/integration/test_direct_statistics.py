"""Direct dispatch's statistics: the frontend workers count the requests they send straight to
stubs in shared memory, and the core adds them up when statistics are read
(``ipc/stat_counters.py``). These tests run ``--frontend-workers 2`` (more where
``SHOAL_TEST_FRONTEND_WORKERS`` asks for more) and check the totals a client reads: the same
counts as the core's own path, a response counted before the client has it (read through
another worker), counts that outlive a killed worker, and a reload that starts the new
version's.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer
from tests.integration.test_direct_dispatch import _EXPAND, _EXPAND_CONFIG, ROUTED
from tests.integration.test_frontend_workers import (
    WORKERS,
    _wait_for_workers,
    through,
    worker_pids,
)

pytestmark = pytest.mark.timeout(240)

PROTOCOLS = ((httpclient, "url"), (grpcclient, "grpc_url"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("direct_statistics")
    (root / "expand" / "1").mkdir(parents=True)
    (root / "expand" / "config.pbtxt").write_text(_EXPAND_CONFIG)
    (root / "expand" / "1" / "model.py").write_text(_EXPAND)
    (root / "raiser").symlink_to(TEST_MODELS / "raiser")
    return root


def _start(repo: Path, direct: bool = True) -> ShoalServer:
    args = ("--frontend-workers", str(WORKERS), "--model-control-mode", "explicit")
    args += ("--load-model", "*")
    extra = () if direct else ("--direct-dispatch", "false")
    return ShoalServer(repo, extra_args=(*args, *extra), metrics=True)


def _client(module: Any, url: str) -> Any:
    """A client on a connection of its own: gRPC shares a connection between channels to one
    address by default, which would keep talking to a worker ``through`` has stopped."""
    if module is grpcclient:
        return grpcclient.InferenceServerClient(
            url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
    return httpclient.InferenceServerClient(url)


def _infer(module: Any, url: str, model: str) -> None:
    """One request (``raiser``'s fails: the model raises), on a connection of its own."""
    client = _client(module, url)
    try:
        _infer_on(module, client, model)
    finally:
        client.close()


def _infer_on(module: Any, client: Any, model: str) -> None:
    if model == "expand":
        tensor = module.InferInput("COUNT", [1], "INT32")
        tensor.set_data_from_numpy(np.array([4], np.int32))
        np.testing.assert_array_equal(
            client.infer("expand", [tensor]).as_numpy("OUT"), np.arange(4, dtype=np.float32)
        )
    else:
        tensor = module.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        with pytest.raises(InferenceServerException):
            client.infer(model, [tensor])


def _stats(module: Any, url: str, model: str) -> dict[str, Any]:
    client = _client(module, url)
    try:
        if module is grpcclient:
            return client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    """Every count of a version's statistics (the durations differ from run to run)."""
    counts = {
        "inference_count": int(stats.get("inference_count", 0)),
        "execution_count": int(stats.get("execution_count", 0)),
    }
    for name, duration in stats["inference_stats"].items():
        counts[name] = int(duration.get("count", 0))
    for batch in stats.get("batch_stats", []):
        for name in ("compute_input", "compute_infer", "compute_output"):
            counts[f"batch {batch['batch_size']} {name}"] = int(batch[name].get("count", 0))
    return counts


def _success(server: ShoalServer, module: Any = httpclient) -> int:
    url = server.url if module is httpclient else server.grpc_url
    return _counts(_stats(module, url, "expand"))["success"]


def _metrics(server: ShoalServer) -> list[str]:
    """Triton's counters of our models in ``/metrics``, but the durations and the gauges."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as answer:
        lines = answer.read().decode().splitlines()
    ours = [line for line in lines if line.startswith("nv_inference_") and "_us{" not in line]
    return sorted(line for line in ours if "pending" not in line)


def _send_everywhere(server: ShoalServer, count: int) -> None:
    """``count`` requests of each model through each worker over each protocol."""
    for index in range(WORKERS):
        for module, attr in PROTOCOLS:
            with through(server, index):
                client = _client(module, getattr(server, attr))
                _infer_on(module, client, "expand")  # connected through worker ``index``
            try:
                for _ in range(count - 1):
                    _infer_on(module, client, "expand")
                _infer_on(module, client, "raiser")
            finally:
                client.close()


def test_the_counts_are_those_of_the_core_s_own_path(repo: Path) -> None:
    totals = []
    for direct in (True, False):
        with _start(repo, direct) as server:
            _send_everywhere(server, 15)
            assert (ROUTED in server.output) is direct, server.output[-3000:]
            stats = {m: _counts(_stats(httpclient, server.url, m)) for m in ("expand", "raiser")}
            totals.append((stats, _metrics(server)))
    (direct_stats, direct_metrics), (core_stats, core_metrics) = totals
    assert direct_stats["expand"]["success"] == 30 * WORKERS
    assert direct_stats["raiser"]["fail"] == 2 * WORKERS
    assert direct_stats == core_stats
    assert direct_metrics == core_metrics
    failed = f"{2 * WORKERS}"
    backend = (
        f'nv_inference_request_failure{{model="raiser",reason="BACKEND",version="1"}} {failed}'
    )
    assert backend in direct_metrics


def test_a_response_is_counted_before_the_client_reads_statistics_through_either_worker(
    repo: Path,
) -> None:
    with _start(repo) as server:
        before = _success(server)
        for sent in range(1, 9):
            module, attr = PROTOCOLS[sent % 2]
            with through(server, sent % WORKERS):
                _infer(module, getattr(server, attr), "expand")
            with through(server, (sent + 1) % WORKERS):
                assert _success(server, PROTOCOLS[sent // 2 % 2][0]) == before + sent
        assert ROUTED in server.output


def test_the_counts_outlive_a_killed_worker_and_a_reload_starts_the_new_version_s(
    repo: Path,
) -> None:
    with _start(repo) as server:
        _send_everywhere(server, 5)
        assert _success(server) == 10 * WORKERS
        first = worker_pids(server)
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while len(set(worker_pids(server)) - set(first)) < 1:
            assert time.monotonic() < deadline, server.output[-3000:]
            time.sleep(0.05)  # polling the process table for the restarted worker
        _until_serving(server)
        assert _success(server) == 10 * WORKERS  # what the killed worker counted is kept
        _send_everywhere(server, 2)
        assert _success(server) == 14 * WORKERS
        client = httpclient.InferenceServerClient(server.url)
        try:
            config = client.get_model_config("expand")
            config["parameters"] = {"reloaded": {"string_value": "yes"}}
            client.load_model("expand", config=json.dumps(config))
        finally:
            client.close()
        assert _success(server) == 0  # a new version: none of the old one's counts
        _send_everywhere(server, 3)
        assert _success(server) == 6 * WORKERS
        assert server.output.count(ROUTED) >= 2 * WORKERS, server.output[-3000:]


def _until_serving(server: ShoalServer) -> None:
    """Wait until the restarted worker is dealt connections (every worker serves)."""
    _wait_for_workers(server, WORKERS)
