"""``shoal perf`` against a real ``shoal serve`` on the bundled models: about a second a run."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.server import REPO_ROOT

pytestmark = pytest.mark.timeout(120)


def _perf(*args: str) -> subprocess.CompletedProcess[str]:
    """``shoal perf`` with ``args``; fails the test if it fails."""
    command = [sys.executable, "-m", "shoal.cli", "perf", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_measures_add_sub(bundled_server, protocol, tmp_path):
    url = bundled_server.url if protocol == "http" else bundled_server.grpc_url
    output = tmp_path / "perf.json"
    run = _perf(
        *("--url", url, "--protocol", protocol, "--model", "add_sub"),
        *("--concurrency", "1,2", "--duration", "0.5", "--warmup", "0.1"),
        *("--json", str(output), "--plot", str(tmp_path / "perf.png")),
    )
    document = json.loads(output.read_text())
    assert document["protocol"] == protocol and document["model"] == "add_sub"
    assert [cell["concurrency"] for cell in document["cells"]] == [1, 2]
    for cell in document["cells"]:
        assert cell["throughput"] > 0
        assert cell["errors"] == 0, cell["error_samples"]
        assert cell["p50_ms"] <= cell["p99_ms"]
    assert "concurrency" in run.stdout  # the table


@pytest.mark.parametrize(("client", "protocol"), [("wrk", "http"), ("h2load", "grpc")])
def test_perf_drives_the_native_clients(bundled_server, client, protocol, tmp_path):
    if shutil.which(client) is None:
        pytest.skip(f"{client} is not installed")
    url = bundled_server.url if protocol == "http" else bundled_server.grpc_url
    output = tmp_path / "perf.json"
    _perf(
        *("--url", url, "--protocol", protocol, "--model", "add_sub", "--client", client),
        *("--concurrency", "2", "--duration", "1", "--warmup", "0.5", "--json", str(output)),
    )
    (cell,) = json.loads(output.read_text())["cells"]
    assert cell["throughput"] > 0 and cell["errors"] == 0
    assert 0 < cell["p50_ms"] <= cell["p99_ms"]


def test_perf_with_system_shared_memory_leaves_no_region(bundled_server, tmp_path):
    output = tmp_path / "perf.json"
    _perf(
        *("--url", bundled_server.url, "--model", "add_sub", "--shared-memory", "system"),
        *("--concurrency", "2", "--duration", "0.5", "--warmup", "0.1", "--json", str(output)),
    )
    (cell,) = json.loads(output.read_text())["cells"]
    assert cell["throughput"] > 0 and cell["errors"] == 0
    status_url = f"http://{bundled_server.url}/v2/systemsharedmemory/status"
    with urllib.request.urlopen(status_url, timeout=10) as status:
        assert json.load(status) == []  # unregistered at the end


def test_perf_takes_perf_analyzer_flag_names(bundled_server, tmp_path):
    data = tmp_path / "data.json"
    # perf_analyzer's --input-data: flat values, shapes from the model's metadata.
    data.write_text(json.dumps({"data": [{"INPUT0": [1.0] * 4, "INPUT1": [2.0] * 4}]}))
    csv_file = tmp_path / "perf.csv"
    _perf(
        *("-m", "add_sub", "-u", bundled_server.url, "-i", "http", "-b", "1"),
        *("--concurrency-range", "1:3:2", "--measurement-interval", "400", "--warmup", "0.1"),
        *("--input-data", str(data), "--shared-memory", "system", "-f", str(csv_file)),
    )
    with csv_file.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["concurrency"] for row in rows] == ["1", "3"]  # 1:3:2 as perf_analyzer
    assert all(row["errors"] == "0" and float(row["throughput"]) > 0 for row in rows), rows


def test_perf_refuses_cuda_shared_memory_with_a_pointer(bundled_server):
    command = [sys.executable, "-m", "shoal", "perf", "-m", "add_sub", "-u", bundled_server.url]
    run = subprocess.run(
        [*command, "--shared-memory", "cuda"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert "perf_analyzer" in run.stderr
