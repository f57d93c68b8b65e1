"""The frontends' own timestamps in Triton's trace file (HTTP_RECV_START..., GRPC_WAITREAD_START
...), through a real server: as Triton's ``qa/common/trace_summary.py`` reads a file, each
request's trace has an entry without a parent holding its frontend's first timestamp, the same
id's REQUEST_START and REQUEST_END and its model, and its timestamps in the order things
happen."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_trace_files import ORDER, _add_sub, _server, _traces, _wait_for
from tests.integration.test_trace_files import repo as repo

pytestmark = pytest.mark.timeout(120)


#: Each frontend's timestamps before the core's, and after.
FRONTEND = {
    "http": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
    "grpc": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], ["GRPC_SEND_START", "GRPC_SEND_END"]),
}


def _summarized(path: Path, protocol: str = "http") -> dict[int, dict]:
    """The traces trace_summary.py summarizes for a frontend, by id: root entries with its
    first timestamp (HTTP_RECV_START, GRPC_WAITREAD_START) select an id (a child is selected
    with its parent), and each id's entries merge (its model, its timestamps by name)."""
    first = FRONTEND[protocol][0][0]
    with open(path) as f:
        entries = sorted(json.load(f), key=lambda e: e.get("id", -1))
    selected: set[int] = set()
    for entry in entries:
        if "parent_id" not in entry:
            if any(first in t["name"] for t in entry.get("timestamps", [])):
                selected.add(entry["id"])
        elif entry["parent_id"] in selected:
            selected.add(entry["id"])
    return {i: t for i, t in _traces(path).items() if i in selected}


def _wrapped(trace: dict, core: list[str], protocol: str = "http") -> None:
    """Its frontend's timestamps around the core's (``core``), all in order, as
    trace_summary.py needs them (it refuses an end before its start)."""
    stamps = trace["timestamps"]
    before, after = FRONTEND[protocol]
    names = [*before, *core, *after]
    assert sorted(stamps, key=names.index) == names, stamps
    times = [stamps[name] for name in names]
    assert times == sorted(times), stamps


def test_http_requests_have_the_frontends_timestamps(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1") as server:
        for n in range(3):
            _add_sub(server, f"req-{n}")
        client = httpclient.InferenceServerClient(server.url)
        try:
            x = httpclient.InferInput("X", [3], "FP32")
            x.set_data_from_numpy(np.arange(3, dtype=np.float32))
            client.infer("ens_chain", [x], request_id="ens")
            wrong = httpclient.InferInput("INPUT0", [4], "FP32")
            wrong.set_data_from_numpy(np.ones(4, dtype=np.float32))
            with pytest.raises(Exception, match="INPUT1"):  # refused before it is traced
                client.infer("add_sub", [wrong], request_id="refused")
        finally:
            client.close()
    traces = _summarized(trace_file)
    roots = {t["request_id"]: t for t in traces.values() if "parent_id" not in t}
    assert sorted(roots) == ["ens", "req-0", "req-1", "req-2"]
    for n in range(3):
        assert roots[f"req-{n}"]["model_name"] == "add_sub"
        _wrapped(roots[f"req-{n}"], ORDER)
    _wrapped(roots["ens"], ["REQUEST_START", "QUEUE_START", "REQUEST_END"])
    steps = [t for t in traces.values() if t.get("parent_id") == roots["ens"]["id"]]
    assert len(steps) == 2  # selected with their parent; their own timestamps are the core's
    for step in steps:
        assert list(step["timestamps"]) == ORDER


def test_a_spent_trace_count_writes_them_at_once(repo, tmp_path):
    """A held trace (its frontend's timestamps come after the response) still counts: the
    file of a spent trace_count is written once they came, while the server runs."""
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1", "count=2") as server:
        for n in range(3):
            _add_sub(server, str(n))
        _wait_for(tmp_path / "trace.json.0")
        traces = _summarized(tmp_path / "trace.json.0")
        assert [t["request_id"] for t in traces.values()] == ["0", "1"]
        for trace in traces.values():
            _wrapped(trace, ORDER)


def test_grpc_requests_have_the_frontends_timestamps(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1") as server:
        for n in range(3):
            _add_sub(server, f"req-{n}", "grpc")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            wrong = grpcclient.InferInput("INPUT0", [4], "FP32")
            wrong.set_data_from_numpy(np.ones(4, dtype=np.float32))
            with pytest.raises(Exception, match="INPUT1"):  # refused before it is traced
                client.infer("add_sub", [wrong], request_id="refused")
        finally:
            client.close()
    traces = _summarized(trace_file, "grpc")
    assert sorted(t["request_id"] for t in traces.values()) == ["req-0", "req-1", "req-2"]
    for trace in traces.values():
        _wrapped(trace, ORDER, "grpc")
