"""Trace files and the logs that sample and buffer traces (Triton's TraceFile, TraceSetting)."""

from __future__ import annotations

import json

import numpy as np

from shoal.supervisor.extensions.trace_files import Trace, TraceFile, TraceLog
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.requests.traced_tensors import values


def _ids(path) -> list[int]:
    with open(path) as f:
        return [entry["id"] for entry in json.load(f) if "model_name" in entry]


def _trace(trace_log: TraceLog) -> Trace:
    assert trace_log.sample()
    trace = Trace(trace_log, "m", 1, "")
    trace.stamp("REQUEST_START", 1)
    return trace


def test_the_trace_file_is_one_valid_json_list_after_every_write(tmp_path):
    path = tmp_path / "t.json"
    file = TraceFile(str(path))
    file.save(['{"id":1}'], indexed=False)
    assert json.loads(path.read_text()) == [{"id": 1}]
    file.save(['{"id":2}', '{"id":3}'], indexed=False)
    assert json.loads(path.read_text()) == [{"id": 1}, {"id": 2}, {"id": 3}]
    file.save(['{"id":4}'], indexed=True)
    file.save(['{"id":5}'], indexed=True)
    assert json.loads((tmp_path / "t.json.0").read_text()) == [{"id": 4}]
    assert json.loads((tmp_path / "t.json.1").read_text()) == [{"id": 5}]


def test_a_spent_count_writes_once_its_last_trace_is_in_whatever_the_rate(tmp_path):
    # Triton compares the traces collected with the requests seen, so with a rate above 1
    # a spent count never wrote its file before exit; shoal waits for the traces it took.
    trace_log = TraceLog(["TIMESTAMPS"], 2, 2, 0, TraceFile(str(tmp_path / "t.json")))
    assert [trace_log.sample() for _ in range(3)] == [False, True, False]
    first = Trace(trace_log, "m", 1, "")
    assert trace_log.sample() and trace_log.count == 0
    second = Trace(trace_log, "m", 1, "")
    assert not trace_log.sample()  # spent
    second.finish()
    assert not (tmp_path / "t.json.0").exists()  # the first is still running
    first.finish()
    assert _ids(tmp_path / "t.json.0") == [second.id, first.id]


def test_a_replaced_log_writes_when_its_running_traces_are_in(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS"], 1, -1, 0, TraceFile(str(tmp_path / "t.json")))
    done, running = _trace(trace_log), _trace(trace_log)
    done.finish()
    trace_log.retire()
    assert not (tmp_path / "t.json").exists()
    running.finish()
    assert _ids(tmp_path / "t.json") == [done.id, running.id]


def test_log_frequency_writes_an_indexed_file_every_n_traces(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS"], 1, -1, 2, TraceFile(str(tmp_path / "t.json")))
    traces = [_trace(trace_log) for _ in range(3)]
    for trace in traces:
        trace.finish()
    assert _ids(tmp_path / "t.json.0") == [traces[0].id, traces[1].id]
    trace_log.retire()
    assert _ids(tmp_path / "t.json.1") == [traces[2].id]
    assert not (tmp_path / "t.json").exists()


def test_an_ensembles_steps_are_written_with_it_as_one_trace(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS"], 1, -1, 1, TraceFile(str(tmp_path / "t.json")))
    parent = _trace(trace_log)
    step = parent.child("step", 3, "r")
    step.stamp("REQUEST_START", 2)
    step.finish()
    assert not (tmp_path / "t.json.0").exists()
    parent.finish()
    with open(tmp_path / "t.json.0") as f:
        entries = json.load(f)
    assert {"id": step.id, "model_name": "step", "model_version": 3} | {
        "request_id": "r",
        "parent_id": parent.id,
    } in entries


def test_a_child_that_outlives_its_parent_is_written_but_not_counted(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS"], 1, 1, 0, TraceFile(str(tmp_path / "t.json")))
    parent = _trace(trace_log)
    late = parent.child("call", 1, "")
    parent.finish()  # the count is spent and its one trace in: written at once
    assert _ids(tmp_path / "t.json.0") == [parent.id]
    late.finish()  # no other write will come: written at once, beside its parent's file
    assert _ids(tmp_path / "t.json.1") == [late.id]


def test_a_child_that_outlives_a_replaced_log_is_written_at_once(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS"], 1, -1, 0, TraceFile(str(tmp_path / "t.json")))
    parent = _trace(trace_log)
    late = parent.child("call", 1, "")
    trace_log.retire()  # an update replaced the setting
    parent.finish()
    assert _ids(tmp_path / "t.json") == [parent.id]
    late.finish()
    assert _ids(tmp_path / "t.json") == [parent.id, late.id]


def test_a_trace_file_rotated_away_starts_a_new_list(tmp_path):
    path = tmp_path / "t.json"
    file = TraceFile(str(path))
    file.save(['{"id":1}'], indexed=False)
    path.rename(tmp_path / "t.json.old")  # logrotate's move
    file.save(['{"id":2}'], indexed=False)
    assert json.loads(path.read_text()) == [{"id": 2}]
    path.write_bytes(b"")  # logrotate's copytruncate
    file.save(['{"id":3}'], indexed=False)
    assert json.loads(path.read_text()) == [{"id": 3}]


def test_large_traces_are_appended_before_the_count_of_traces_says_so(tmp_path):
    trace_log = TraceLog(["TIMESTAMPS", "TENSORS"], 1, -1, 0, TraceFile(str(tmp_path / "t.json")))
    trace = _trace(trace_log)
    trace.tensor("TENSOR_QUEUE_INPUT", "IN", "INT8", "1", "1," * (16 << 20))
    trace.finish()  # one trace, not APPEND_EVERY: its size alone has it written
    assert _ids(tmp_path / "t.json") == [trace.id]


def test_trace_count_is_reported_as_it_runs_down_and_models_sample_apart(tmp_path):
    settings = TraceSettings(
        initial={
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "1",
            "trace_count": "3",
            "trace_file": str(tmp_path / "t.json"),
        }
    )
    settings.update({"trace_count": "1"}, model="own")
    assert settings.context_for("a") and settings.context_for("b")
    assert settings.current()["trace_count"] == "1"
    assert settings.current("own")["trace_count"] == "1"
    assert settings.context_for("own") and not settings.context_for("own")
    assert settings.current("own")["trace_count"] == "0"
    assert settings.current()["trace_count"] == "1"  # the model's count is its own
    # A global update of another setting keeps what is left of the count.
    settings.update({"trace_rate": "1"})
    assert settings.current()["trace_count"] == "1"


def test_only_trace_mode_triton_with_a_file_writes(tmp_path):
    opentelemetry = TraceSettings(
        initial={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_mode": "opentelemetry"}
    )
    context = opentelemetry.context_for("m")
    assert context and opentelemetry.begin(context, "m", 1, "") is None
    triton = TraceSettings(
        initial={
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "1",
            "trace_file": str(tmp_path / "t.json"),
        }
    )
    context = triton.context_for("m")
    trace = triton.begin(context, "m", 1, "")
    assert trace is not None and triton.begin(context, "m", 1, "") is None
    trace.finish()
    triton.close()
    assert len(_ids(tmp_path / "t.json")) == 1


def test_tensor_values_are_written_as_triton_writes_them():
    def data(array):
        return memoryview(np.asarray(array).tobytes())

    assert values("FP32", data(np.array([0.1, 1.0, -2.5e-7], np.float32))) == "0.1,1,-2.5e-07"
    assert values("BOOL", data([True, False])) == "1,0"
    assert values("INT8", data(np.array([-3, 7], np.int8))) == "-3,7"  # Triton: as chars
    strings = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"c,d"))
    assert values("BYTES", memoryview(strings)) == '"ab","c,d"'
    assert values("BF16", data(np.array([1, 2], np.uint16))) == ""  # NumPy has no BF16
    assert values("FP32", memoryview(b"abc")) == ""  # not a whole element


def _held(settings: TraceSettings) -> tuple[int, Trace]:
    """A sampled request whose frontend hands its timestamps, and its trace, begun."""
    context = settings.context_for("m")
    trace_id = settings.hold(context)
    trace = settings.begin(context, "m", 1, "r")
    assert trace is not None and trace.id == trace_id and trace.held
    return trace_id, trace


def _entries(path) -> list[dict]:
    with open(path) as f:
        return json.load(f)


def test_a_held_trace_is_written_once_its_frontends_timestamps_came(tmp_path):
    path = tmp_path / "t.json"
    settings = TraceSettings(
        initial={"trace_file": str(path), "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    )
    settings.update({"trace_count": "1"})
    trace_id, trace = _held(settings)
    trace.stamp("REQUEST_START", 5)
    trace.finish()
    assert not (tmp_path / "t.json.0").exists()  # the count is spent, its trace not in yet
    settings.frontend(trace_id, [("HTTP_RECV_START", 1), ("HTTP_SEND_END", 9)])
    settings.frontend(trace_id, [("HTTP_SEND_END", 10)])  # once only
    entries = _entries(tmp_path / "t.json.0")
    assert entries[-1] == {
        "id": trace_id,
        "timestamps": [{"name": "HTTP_RECV_START", "ns": 1}, {"name": "HTTP_SEND_END", "ns": 9}],
    }
    assert [e["id"] for e in entries] == [trace_id] * 3  # model, REQUEST_START, frontend


def test_frontend_timestamps_before_the_end_and_held_traces_at_shutdown(tmp_path):
    path = tmp_path / "t.json"
    settings = TraceSettings(
        initial={"trace_file": str(path), "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    )
    early_id, early = _held(settings)
    settings.frontend(early_id, [("HTTP_RECV_START", 1)])  # still running: written at its end
    _, never = _held(settings)
    never.finish()  # its frontend's timestamps never come (the client left)
    refused = settings.context_for("m")
    settings.frontend(settings.hold(refused), [])  # sampled, never begun: forgotten
    assert settings.hold("not sampled") == 0
    early.finish()
    settings.close()
    ids = [e["id"] for e in _entries(path) if "model_name" in e]
    assert ids == [early.id, never.id]
    assert {"id": early.id, "timestamps": [{"name": "HTTP_RECV_START", "ns": 1}]} in _entries(path)
    assert not settings._held and not settings._held_ids
