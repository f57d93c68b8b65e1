"""Triton's trace files (``--trace-config triton,file=PATH``) through a real server: what a
traced request writes, over HTTP and gRPC; trace_rate, trace_count, log_frequency and their
files; tracing turned off; a model traced alone; an ensemble's steps as child traces."""

from __future__ import annotations

import csv
import json
import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer
from tests.integration.test_triton_semantics import TRACED, TRACED_IO

pytestmark = pytest.mark.timeout(120)

#: The frontends' timestamps begin so (Triton's HTTP and gRPC frontends).
FRONTENDS = ("HTTP_", "GRPC_")
#: The core's activities of a model's request, in the order they happen.
ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "INFER_RESPONSE_COMPLETE",
    "REQUEST_END",
]


@pytest.fixture
def repo(tmp_path):
    """add_sub and identity, ens_chain (ens_scale, then identity) and decoupled_repeat."""
    root = tmp_path / "models"
    for source in (BUNDLED / "add_sub", BUNDLED / "identity"):
        shutil.copytree(source, root / source.name)
    for name in ("ens_chain", "ens_scale", "decoupled_repeat"):
        shutil.copytree(TEST_MODELS / name, root / name)
    return root


def _server(repo: Path, trace_file: Path, *config: str) -> ShoalServer:
    args = ["--trace-config", f"triton,file={trace_file}"]
    for entry in config:
        args += ["--trace-config", entry]
    return ShoalServer(repo, extra_args=tuple(args))


def _traces(path: Path) -> dict[int, dict]:
    """The file read as trace_summary.py reads it (one JSON list), grouped by trace id: the
    model entry's fields and ``timestamps`` (name -> ns, in the file's order)."""
    with open(path) as f:
        entries = json.load(f)
    assert isinstance(entries, list)
    traces: dict[int, dict] = {}
    for entry in entries:
        trace = traces.setdefault(entry["id"], {"timestamps": {}})
        for stamp in entry.pop("timestamps", []):
            trace["timestamps"][stamp["name"]] = stamp["ns"]
        trace.update(entry)
    return traces


def _add_sub(server: ShoalServer, request_id: str, protocol: str = "http") -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = module.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
            inputs.append(tensor)
        result = client.infer("add_sub", inputs, request_id=request_id)
        assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 4
    finally:
        client.close()


def _ordered(trace: dict, names: list[str]) -> None:
    """The core's timestamps are ``names``, in order (a frontend's: test_trace_frontends)."""
    stamps = {k: v for k, v in trace["timestamps"].items() if not k.startswith(FRONTENDS)}
    assert list(stamps) == names
    times = [stamps[name] for name in names]
    assert times == sorted(times), stamps
    # Triton's steady clock is CLOCK_MONOTONIC, as time.monotonic_ns here.
    assert 0 < times[0] <= time.monotonic_ns()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # polling for the file, not waiting on time
    assert path.exists(), f"{path} was not written"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_traced_request_writes_its_model_and_ordered_timestamps(repo, tmp_path, protocol):
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1") as server:
        for n in range(3):
            _add_sub(server, f"req-{n}", protocol)
    traces = _traces(trace_file)  # written at shutdown: nothing asked for it earlier
    assert sorted(traces) == [1, 2, 3]
    for n, trace in enumerate(traces[i] for i in sorted(traces)):
        assert trace["model_name"] == "add_sub" and trace["model_version"] == 1
        assert trace["request_id"] == f"req-{n}" and "parent_id" not in trace
        _ordered(trace, ORDER)


def test_rate_count_log_frequency_and_off(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=2") as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            for n in range(6):  # the 2nd, the 4th and the 6th are traced
                _add_sub(server, str(n))
            settings = client.update_trace_settings(
                settings={"trace_rate": "1", "trace_count": "2"}
            )
            assert settings["trace_count"] == "2"
            for n in range(6, 10):  # 6 and 7: then trace_count is spent
                _add_sub(server, str(n))
            assert client.get_trace_settings()["trace_count"] == "0"
            # Spent, and its traces in: written to PATH.0 at once, as Triton.
            _wait_for(tmp_path / "trace.json.0")
            assert [t["request_id"] for t in _traces(tmp_path / "trace.json.0").values()] == [
                "6",
                "7",
            ]
            client.update_trace_settings(settings={"trace_count": "-1", "log_frequency": "2"})
            for n in range(10, 15):  # two files of two, one left
                _add_sub(server, str(n))
            _wait_for(tmp_path / "trace.json.2")
            client.update_trace_settings(settings={"trace_level": ["OFF"]})
            _wait_for(tmp_path / "trace.json.3")  # the one left, written by the update
            for n in range(15, 18):  # not traced: tracing is off
                _add_sub(server, str(n))
        finally:
            client.close()
    # The first setting's traces, written when the update replaced it.
    assert [t["request_id"] for t in _traces(trace_file).values()] == ["1", "3", "5"]
    rotated = [
        [t["request_id"] for t in _traces(tmp_path / f"trace.json.{n}").values()] for n in (1, 2, 3)
    ]
    assert rotated == [["10", "11"], ["12", "13"], ["14"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "models",
        "trace.json",
        *(f"trace.json.{n}" for n in range(4)),
    ]


def _stream(server: ShoalServer, responses: int) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([responses], dtype=np.int32))
        client.async_stream_infer("decoupled_repeat", [count], request_id="stream")
        for _ in range(responses):
            assert answers.get(timeout=30)[1] is None
    finally:
        client.stop_stream()
        client.close()


def test_models_traced_alone_an_ensembles_steps_and_a_stream(repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file) as server:  # level OFF: nothing traced
        client = httpclient.InferenceServerClient(server.url)
        try:
            _add_sub(server, "before")
            for model in ("add_sub", "ens_chain", "decoupled_repeat"):
                client.update_trace_settings(
                    model_name=model, settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
                )
            _add_sub(server, "add_sub")
            x = httpclient.InferInput("X", [3], "FP32")
            x.set_data_from_numpy(np.arange(3, dtype=np.float32))
            chained = client.infer("ens_chain", [x], request_id="ens")
            assert chained.as_numpy("Y").tolist() == [0.0, 2.0, 4.0]
            identity = httpclient.InferInput("IN_FP32", [2], "FP32")
            identity.set_data_from_numpy(np.ones(2, dtype=np.float32))
            client.infer("identity", [identity], request_id="untraced")
            _stream(server, 3)
        finally:
            client.close()
    traces = _traces(trace_file)
    by_model = {t["model_name"]: t for t in traces.values()}
    assert sorted(t["request_id"] for t in traces.values()) == [
        "add_sub",
        *["ens"] * 3,
        "stream",
    ]
    _ordered(by_model["add_sub"], ORDER)
    ensemble = by_model["ens_chain"]
    _ordered(ensemble, ["REQUEST_START", "QUEUE_START", "REQUEST_END"])
    steps = [t for t in traces.values() if t.get("parent_id") == ensemble["id"]]
    assert [t["model_name"] for t in steps] == ["ens_scale", "identity"]
    for step in steps:
        _ordered(step, ORDER)
        assert ensemble["timestamps"]["REQUEST_START"] <= step["timestamps"]["REQUEST_START"]
        assert step["timestamps"]["REQUEST_END"] <= ensemble["timestamps"]["REQUEST_END"]
    # A decoupled request: from its start to its last response.
    _ordered(by_model["decoupled_repeat"], ["REQUEST_START", "QUEUE_START", "REQUEST_END"])


def test_a_trace_file_that_cannot_be_written_is_logged_once(repo, tmp_path):
    trace_file = tmp_path / "missing" / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1", "log-frequency=1") as server:
        for n in range(3):
            _add_sub(server, str(n))  # served all the same
        server.stop()
        assert server.output.count("cannot write the trace file") == 1
    assert not trace_file.parent.exists()


def _array(tensor: dict) -> np.ndarray:
    """A tensor entry's values, read as trace_summary.py's get_numpy_array reads them."""
    shape = [int(d) for d in tensor["shape"].split(",")]
    if tensor["dtype"] == "BYTES":
        values = next(csv.reader([tensor["data"]], skipinitialspace=True))
        return np.array(values, dtype=np.object_).reshape(shape)
    dtype = {"FP32": np.float32, "BOOL": bool, "INT64": np.int64}[tensor["dtype"]]
    return np.array([float(v) for v in tensor["data"].split(",")], dtype=dtype).reshape(shape)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tensors_level_writes_inputs_and_outputs(repo, tmp_path, protocol):
    trace_file = tmp_path / "trace.json"
    sent = {
        "IN_FP32": np.array([0.5, 1.5, -2.0], dtype=np.float32),
        "IN_BOOL": np.array([True, False]),
        "IN_STRING": np.array(["ab", "c,d"], dtype=np.object_),
        "IN_INT64": np.arange(50_000, dtype=np.int64),  # in an arena block, not inline
    }
    config = ("level=TIMESTAMPS", "level=TENSORS", "rate=1")
    with _server(repo, trace_file, *config) as server:
        module = httpclient if protocol == "http" else grpcclient
        client = module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
        try:
            inputs = []
            for name, array in sent.items():
                datatype = {"IN_FP32": "FP32", "IN_BOOL": "BOOL", "IN_STRING": "BYTES"}
                tensor = module.InferInput(name, list(array.shape), datatype.get(name, "INT64"))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            client.infer("identity", inputs)
        finally:
            client.close()
    with open(trace_file) as f:
        entries = json.load(f)
    tensors = {
        (e["activity"], e["tensor"]["name"]): _array(e["tensor"])
        for e in entries
        if "activity" in e
    }
    assert len(tensors) == 2 * len(sent)
    for name, array in sent.items():
        out = "OUT_" + name.removeprefix("IN_")
        for key in (("TENSOR_QUEUE_INPUT", name), ("TENSOR_BACKEND_OUTPUT", out)):
            if array.dtype == np.object_:
                assert tensors[key].tolist() == array.tolist(), key
            else:
                np.testing.assert_array_equal(tensors[key], array)


def test_tensors_level_traces_an_ensembles_own_and_its_nested_ensembles_tensors(tmp_path):
    # As Triton's (L0_cmdline_trace): the ensemble's request and a nested ensemble's each
    # trace their inputs when queued and their outputs when answered, beside their steps'.
    repo = tmp_path / "models"
    for source in (BUNDLED / "add_sub", BUNDLED / "identity"):
        shutil.copytree(source, repo / source.name)
    for name in ("ens_nested", "ens_diamond", "ens_scale"):
        shutil.copytree(TEST_MODELS / name, repo / name)
    trace_file = tmp_path / "trace.json"
    config = ("level=TIMESTAMPS", "level=TENSORS", "rate=1")
    x = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    with _server(repo, trace_file, *config) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            given = httpclient.InferInput("X", [4], "FP32")
            given.set_data_from_numpy(x)
            result = client.infer("ens_nested", [given], request_id="nested")
            total, spread = result.as_numpy("TOTAL"), result.as_numpy("SPREAD")
        finally:
            client.close()
    with open(trace_file) as f:
        entries = json.load(f)
    models = {e["id"]: e["model_name"] for e in entries if "model_name" in e}
    traced: dict[str, dict[tuple[str, str], np.ndarray]] = {}
    for entry in entries:
        if "activity" in entry:
            tensors = traced.setdefault(models[entry["id"]], {})
            tensors[(entry["activity"], entry["tensor"]["name"])] = _array(entry["tensor"])
    outer = traced["ens_nested"]
    assert sorted(outer) == [
        ("TENSOR_BACKEND_OUTPUT", "SPREAD"),
        ("TENSOR_BACKEND_OUTPUT", "TOTAL"),
        ("TENSOR_QUEUE_INPUT", "X"),
    ]
    np.testing.assert_array_equal(outer[("TENSOR_QUEUE_INPUT", "X")], x)
    np.testing.assert_array_equal(outer[("TENSOR_BACKEND_OUTPUT", "TOTAL")], total)
    np.testing.assert_array_equal(outer[("TENSOR_BACKEND_OUTPUT", "SPREAD")], spread)
    inner = traced["ens_diamond"]
    assert sorted(inner) == [
        ("TENSOR_BACKEND_OUTPUT", "DIFF"),
        ("TENSOR_BACKEND_OUTPUT", "SUM"),
        ("TENSOR_QUEUE_INPUT", "X"),
    ]
    np.testing.assert_array_equal(inner[("TENSOR_QUEUE_INPUT", "X")], x)
    assert "add_sub" in traced  # the steps' own, as before


def test_a_bls_call_given_its_callers_trace_is_a_child_trace(tmp_path):
    repo = tmp_path / "models"
    (repo / "traced" / "1").mkdir(parents=True)
    (repo / "traced" / "1" / "model.py").write_text(TRACED)
    (repo / "traced" / "config.pbtxt").write_text(f'name: "traced"\nbackend: "python"\n{TRACED_IO}')
    trace_file = tmp_path / "trace.json"
    with _server(repo, trace_file, "level=TIMESTAMPS", "rate=1") as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
            result = client.infer("traced", [tensor], request_id="caller")
            assert result.as_numpy("CHILD")[0]  # the call saw the caller's context
        finally:
            client.close()
    traces = _traces(trace_file)
    assert len(traces) == 2
    caller, call = (traces[i] for i in sorted(traces))
    assert "parent_id" not in caller and call["parent_id"] == caller["id"]
    assert call["model_name"] == "traced" and caller["request_id"] == "caller"
    _ordered(caller, ORDER)
    _ordered(call, ORDER)
    # The call runs inside its caller's execution.
    assert caller["timestamps"]["COMPUTE_START"] <= call["timestamps"]["REQUEST_START"]
    assert call["timestamps"]["REQUEST_END"] <= caller["timestamps"]["COMPUTE_END"]
