"""benchmarks/compare.py without servers: its matrix, its table and its CPU accounting."""

import os
import sys

import pytest

from benchmarks.compare import (
    MIB,
    Cell,
    Measured,
    _shoal_command,
    markdown,
    matrix,
    tree_cpu_seconds,
)
from shoal.perf.stats import summarize

pytestmark = pytest.mark.timeout(10)


def test_the_full_matrix_is_the_issues():
    cells = matrix(quick=False)
    identity = [c for c in cells if c.model == "identity_fp32"]
    assert len(identity) == 12  # {http, grpc} x {64 B, 64 KiB, 4 MiB} x {1, 8}
    assert {(c.protocol, c.payload_bytes, c.concurrency) for c in identity} == {
        (p, s, c) for p in ("http", "grpc") for s in (64, 64 * 1024, 4 * MIB) for c in (1, 8)
    }
    assert {c.concurrency for c in cells if c.model == "batched_identity"} == {16, 64}
    assert {c.concurrency for c in cells if "add_sub" in c.model and c.model != "add_sub"} == {8}
    assert all(c.streaming for c in cells if c.model == "token_streamer")
    assert len({c.label for c in cells}) == len(cells)


def test_the_quick_matrix_is_a_subset():
    full = {c.label for c in matrix(quick=False)}
    assert {c.label for c in matrix(quick=True)} <= full


def _measured(server, rate, p50_ms):
    result = summarize(
        model="m",
        protocol="http",
        client="wrk",
        concurrency=1,
        duration_s=1.0,
        latencies_ns=[int(p50_ms * 1e6)] * rate,
        errors=0,
    )
    return Measured(server, result, server_cpu_percent=100.0)


def test_markdown_gives_shoal_over_triton_ratios():
    cell = Cell("identity_fp32", "http", 1, 64)
    table = markdown([(cell, _measured("shoal", 50, 2.0), _measured("triton", 100, 1.0))])
    row = table.splitlines()[2].split("|")
    assert row[1].strip() == "identity_fp32 http 64 B c=1"
    assert row[4].strip() == "0.50"  # throughput ratio
    assert row[7].strip() == "2.00"  # p50 ratio
    assert row[9].strip() == "20,000 / 10,000"  # server CPU µs per request


def test_a_failed_cell_has_no_ratio():
    cell = Cell("identity_fp32", "http", 1, 64)
    table = markdown([(cell, _measured("shoal", 0, 1.0), _measured("triton", 100, 1.0))])
    assert "n/a" in table.splitlines()[2]


def test_a_baseline_peer_names_its_columns():
    cell = Cell("identity_fp32", "http", 1, 64)
    table = markdown(
        [(cell, _measured("shoal", 50, 2.0), _measured("baseline", 100, 1.0))], "baseline old"
    )
    header = table.splitlines()[0]
    assert "baseline old /s" in header and "shoal/baseline old" in header
    assert "Triton" not in header


def test_a_baseline_without_a_venv_runs_with_this_interpreter(tmp_path):
    program, env = _shoal_command(tmp_path)
    assert program == [sys.executable, "-m", "shoal"]
    assert env["PYTHONPATH"] == str(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "shoal").write_text("")
    program, _ = _shoal_command(tmp_path)
    assert program == [str(tmp_path / ".venv" / "bin" / "shoal")]


def test_tree_cpu_counts_this_process():
    assert tree_cpu_seconds(os.getpid()) > 0
