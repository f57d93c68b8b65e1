"""Decoupled models inside ensembles, as Triton runs them (qa/L0_decoupled's repeat_square and
nested_square): each response of the decoupled step runs the later steps, each completion of
the ensemble's outputs is one response of its stream, FINAL once every step is done."""

from __future__ import annotations

import json
import os
import queue
import signal
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer
from tests.integration.test_clients import wait_arena_empty
from tests.stream_cancel import stop_stream_cancelling

pytestmark = pytest.mark.timeout(180)

MODELS = (
    "ens_stream",
    "ens_stream_nested",
    "ens_stream_cancel",
    "ens_flood",
    "ens_stream_optional",
)
#: Spaces past the inline budget: the text is staged in the input arena, which must empty.
PADDING = b" " * (64 << 10)


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args), metrics=True) as srv:
        yield srv


def _text(words: str) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([words.encode() + PADDING], dtype=object))
    return [text]


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class _Stream:
    """A gRPC stream whose responses (or errors) are read in order."""

    def __init__(self, server: ShoalServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put((result, error)))

    def send(self, model: str, inputs, request_id: str = "", outputs=None) -> None:
        self.client.async_stream_infer(
            model,
            inputs,
            request_id=request_id,
            outputs=outputs,
            enable_empty_final_response=True,
        )

    def until_final(self):
        """The request's responses to its final one (the error that ends it, last)."""
        got = []
        while True:
            result, error = self.items.get(timeout=60)
            got.append(error if error is not None else result)
            if error is not None or _final(result):
                return got

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _values(results, name: str) -> list[int]:
    return [int(r.as_numpy(name)[0]) for r in results if r.as_numpy(name) is not None]


def _success(server: ShoalServer, model: str) -> int:
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    client.close()
    return int(stats["success"]["count"])


def test_each_response_of_the_decoupled_step_runs_the_later_steps(server):
    stream = _Stream(server)
    try:
        for _ in range(3):
            stream.send("ens_stream", _text("one two three four five"))
            results = stream.until_final()
            assert _values(results, "INDEX") == [0, 1, 2, 3, 4]
            assert _values(results, "OUT") == [0, 1, 4, 9, 16]
            assert results[-1].get_response().model_name == "ens_stream"
        # Requests on one stream run at once; each gets its own responses, in order.
        for index, words in enumerate(("a", "a b c", "a b c d e f")):
            stream.send("ens_stream", _text(words), request_id=str(index))
        by_id: dict[str, list[int]] = {"0": [], "1": [], "2": []}
        finals = 0
        while finals < 3:
            result, error = stream.items.get(timeout=60)
            assert error is None, error
            request_id = result.get_response().id
            if result.as_numpy("OUT") is not None:
                by_id[request_id].append(int(result.as_numpy("OUT")[0]))
            finals += _final(result)
        assert by_id == {"0": [0], "1": [0, 1, 4], "2": [0, 1, 4, 9, 16, 25]}
    finally:
        stream.close()
    wait_arena_empty(server)


def test_http_generate_stream_sends_each_response_as_an_event(server):
    url = f"http://{server.url}/v2/models/ens_stream/generate_stream"
    reply = requests.post(url, data=json.dumps({"TEXT": "a b c"}), timeout=30)
    assert reply.status_code == 200, reply.text
    chunks = reply.content.split(b"\n\n")
    events = [json.loads(c.removeprefix(b"data: ")) for c in chunks if c]
    assert [(e["INDEX"], e["OUT"]) for e in events] == [(0, 0), (1, 1), (2, 4)]
    wait_arena_empty(server)


def test_no_response_of_the_decoupled_step_is_the_final_flag_alone(server):
    stream = _Stream(server)
    try:
        stream.send("ens_stream", _text(""))
        (result,) = stream.until_final()
        assert _final(result)
        assert not result.get_response().outputs
    finally:
        stream.close()
    wait_arena_empty(server)


def test_an_error_in_a_later_step_ends_the_stream(server):
    failed = _stream_failures(server)
    stream = _Stream(server)
    try:
        stream.send("ens_stream", _text("w " * 10))
        *results, error = stream.until_final()
        assert isinstance(error, InferenceServerException), error
        assert "in ensemble 'ens_stream', square_int32 refuses 7" in str(error)
        assert _values(results, "OUT") == [i * i for i in range(7)]
        stream.send("ens_stream", _text("still serving"))
        assert _values(stream.until_final(), "OUT") == [0, 1]
    finally:
        stream.close()
    assert _stream_failures(server) == failed + 1
    wait_arena_empty(server)


def _stream_failures(server: ShoalServer) -> int:
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("ens_stream")["model_stats"][0]["inference_stats"]
    client.close()
    return int(stats["fail"]["count"])


def test_a_call_without_a_stream_is_refused_as_for_any_decoupled_model(server):
    client = httpclient.InferenceServerClient(server.url)
    # Triton's rule: an ensemble with a decoupled step is decoupled, declared or not.
    config = client.get_model_config("ens_stream")
    assert config["model_transaction_policy"] == {"decoupled": True}
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a b"], dtype=object))
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
        client.infer("ens_stream", [text])
    client.close()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
        grpc.infer("ens_stream", _text("a b"))
    grpc.close()
    wait_arena_empty(server)


def test_a_decoupled_ensemble_streams_as_a_step(server):
    before = {m: _success(server, m) for m in ("ens_stream_nested", "ens_stream", "square_int32")}
    stream = _Stream(server)
    try:
        stream.send("ens_stream_nested", _text("a b c d"))
        assert _values(stream.until_final(), "OUT") == [0, 1, 16, 81]
    finally:
        stream.close()
    after = {m: _success(server, m) for m in before}
    # One request of each ensemble; square_int32 ran for each response, at both levels.
    assert after == {
        "ens_stream_nested": before["ens_stream_nested"] + 1,
        "ens_stream": before["ens_stream"] + 1,
        "square_int32": before["square_int32"] + 8,
    }
    wait_arena_empty(server)


def test_statistics_count_one_request_per_step_and_response(server):
    models = ("ens_stream", "word_count", "decoupled_repeat", "square_int32")
    before = {m: _success(server, m) for m in models}
    stream = _Stream(server)
    try:
        for _ in range(2):
            stream.send("ens_stream", _text("a b c"))
            stream.until_final()
    finally:
        stream.close()
    after = {m: _success(server, m) for m in models}
    assert {m: after[m] - before[m] for m in models} == {
        "ens_stream": 2,
        "word_count": 2,
        "decoupled_repeat": 2,
        "square_int32": 6,
    }


def _tick_stream(server: ShoalServer) -> _Stream:
    """A stream of ens_stream_cancel that has given three responses (negated ticks)."""
    stream = _Stream(server)
    tick = grpcclient.InferInput("IN", [1], "INT32")
    tick.set_data_from_numpy(np.array([0], dtype=np.int32))
    stream.send("ens_stream_cancel", [tick])
    for expected in (0, -1, -2):
        result, error = stream.items.get(timeout=60)
        assert error is None, error
        assert int(result.as_numpy("OUT")[0]) == expected
    return stream


def test_closing_the_stream_cancels_the_decoupled_step(server):
    line = "decoupled_until_cancel: cancelled=True"
    seen = server.output.count(line)
    stream = _tick_stream(server)
    stop_stream_cancelling(stream.client)
    stream.client.close()
    deadline = time.monotonic() + 20
    while server.output.count(line) == seen and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the server log for the model's own line
    assert server.output.count(line) == seen + 1, server.output[-3000:]


def test_a_decoupled_step_far_faster_than_the_next_ends_the_stream(server):
    # decoupled_flood sends as fast as it can, slow_negate_int32 takes 5 ms a response: without
    # a bound every waiting response is held in the core until the client gives up.
    stream = _Stream(server)
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([1_000_000], dtype=np.int32))
        stream.send("ens_flood", [count])
        *results, error = stream.until_final()
        assert isinstance(error, InferenceServerException), error
        assert "in ensemble 'ens_flood'" in str(error) and "at most 8192 may" in str(error)
        assert len(results) < 8192
    finally:
        stream.close()
    line = "decoupled_flood: cancelled=True"
    deadline = time.monotonic() + 30
    while line not in server.output and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the server log for the model's own line
    assert line in server.output, server.output[-3000:]
    wait_arena_empty(server)


def _stub_of(server: ShoalServer, model: str) -> int:
    for pid in server.stub_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if any(arg.startswith(model.encode() + b"_0") for arg in f.read().split(b"\0")):
                return pid
    raise AssertionError(f"no stub of {model}")


def test_the_decoupled_step_dying_fails_the_stream(server):
    stream = _tick_stream(server)
    try:
        os.kill(_stub_of(server, "decoupled_until_cancel"), signal.SIGKILL)
        while True:  # the ticks sent before the death, then the error
            result, error = stream.items.get(timeout=60)
            if error is not None:
                break
            assert not _final(result)
        assert "decoupled_until_cancel" in str(error), error
    finally:
        stream.close()
    # The instance restarts and the ensemble streams again.
    deadline = time.monotonic() + 60
    client = httpclient.InferenceServerClient(server.url)
    while not client.is_model_ready("decoupled_until_cancel") and time.monotonic() < deadline:
        time.sleep(0.05)  # polling readiness while the stub restarts
    client.close()
    again = _tick_stream(server)
    stop_stream_cancelling(again.client)
    again.client.close()


def test_a_traced_stream_has_its_steps_as_children(tmp_path):
    trace_file = tmp_path / "trace.json"
    args = (
        *("--model-control-mode", "explicit", "--load-model", "ens_stream"),
        *("--trace-config", f"triton,file={trace_file}"),
        *("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"),
    )
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        stream = _Stream(server)
        try:
            stream.send("ens_stream", _text("a b"), request_id="traced")
            assert _values(stream.until_final(), "OUT") == [0, 1]
        finally:
            stream.close()
    # Written at shutdown: one JSON list of entries, each trace's spread over several.
    traces: dict[int, dict] = {}
    for entry in json.loads(trace_file.read_text()):
        trace = traces.setdefault(entry["id"], {"timestamps": []})
        trace["timestamps"] += [stamp["name"] for stamp in entry.pop("timestamps", [])]
        trace.update(entry)
    (ensemble,) = [t for t in traces.values() if t["model_name"] == "ens_stream"]
    assert ensemble["timestamps"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    steps = [t for t in traces.values() if t.get("parent_id") == ensemble["id"]]
    assert sorted(t["model_name"] for t in steps) == [
        "decoupled_repeat",
        "square_int32",
        "square_int32",
        "word_count",
    ]
    for step in steps:
        assert step["request_id"] == "traced"
        assert step["timestamps"][:2] == ["REQUEST_START", "QUEUE_START"]
        assert step["timestamps"][-1] == "REQUEST_END"


def _count(value: int) -> list[grpcclient.InferInput]:
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [count]


def _outputs(*names: str) -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(name) for name in names]


def _executions(server: ShoalServer, model: str) -> int:
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics(model)["model_stats"][0]
    client.close()
    return int(stats["execution_count"])


def test_a_step_runs_without_the_output_its_producer_did_not_make(server):
    # Each response of decoupled_repeat runs step 1, which makes no B_OUT: as in Triton,
    # step 2 runs without that optional input and GONE is left out of every response.
    stream = _Stream(server)
    try:
        stream.send("ens_stream_optional", _count(3), outputs=_outputs("OUT", "GONE", "NEG"))
        results = stream.until_final()
        assert _values(results, "OUT") == [0, 1, 2]
        assert _values(results, "NEG") == [0, -1, -2]
        assert all(r.as_numpy("GONE") is None for r in results)
    finally:
        stream.close()
    wait_arena_empty(server)


def test_a_step_no_requested_output_needs_does_not_run(server):
    # NEG is made by negate_int32 alone: a request that does not ask for it does not run the
    # step (Triton prunes it for every ensemble, decoupled ones too).
    before = _executions(server, "negate_int32")
    stream = _Stream(server)
    try:
        stream.send("ens_stream_optional", _count(3), outputs=_outputs("OUT"))
        results = stream.until_final()
        assert _values(results, "OUT") == [0, 1, 2]
        assert all(r.as_numpy("NEG") is None for r in results)
    finally:
        stream.close()
    assert _executions(server, "negate_int32") == before
    wait_arena_empty(server)
