"""Ensembles: a diamond-shaped DAG whose intermediates pass between stubs by descriptor."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit", "--load-model", "ens_diamond")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args, metrics=True) as srv:
        yield srv


def _x(values):
    inp = httpclient.InferInput("X", [4], "FP32")
    inp.set_data_from_numpy(np.asarray(values, dtype=np.float32))
    return inp


def test_diamond_ensemble(server):
    client = httpclient.InferenceServerClient(server.url)
    # Loading the ensemble loaded its step models, as Triton does.
    for model in ("ens_diamond", "ens_scale", "identity", "add_sub"):
        assert client.is_model_ready(model), model
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    for _ in range(20):
        result = client.infer("ens_diamond", [_x(x)])
        np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * x + x)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), 2 * x - x)
    meta = client.get_model_metadata("ens_diamond")
    assert meta["platform"] == "ensemble"
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["ens_diamond"]["inference_stats"]["success"]["count"] == 20
    assert stats["ens_scale"]["inference_stats"]["success"]["count"] >= 20
    assert stats["add_sub"]["execution_count"] >= 20
    client.close()


def test_ensemble_errors_name_the_step(server):
    client = httpclient.InferenceServerClient(server.url)
    bad = httpclient.InferInput("X", [3], "FP32")
    bad.set_data_from_numpy(np.ones(3, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'X'"):
        client.infer("ens_diamond", [bad])
    assert client.is_server_live()
    client.close()


def test_ensemble_with_mismatched_datatypes_fails_at_load(server):
    client = httpclient.InferenceServerClient(server.url)
    expected = r"tensor 'X' is INT32 but 'INPUT[01]' of model 'add_sub' is FP32"
    with pytest.raises(InferenceServerException, match=expected):
        client.load_model("ens_bad_dtype")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "INT32" in index["ens_bad_dtype"]["reason"]
    client.close()


def _success(client, model):
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def test_nested_ensemble_runs_each_level(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_nested")  # loads its steps first, the nested ensemble among them
    levels = ("ens_nested", "ens_diamond", "ens_scale", "add_sub")
    before = {model: _success(client, model) for model in levels}
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    for _ in range(10):
        result = client.infer("ens_nested", [_x(x)])
        np.testing.assert_array_equal(result.as_numpy("TOTAL"), 4 * x)
        np.testing.assert_array_equal(result.as_numpy("SPREAD"), 2 * x)
    gained = {model: _success(client, model) - before[model] for model in levels}
    # One request per level per inference; add_sub runs in both levels.
    assert gained == {"ens_nested": 10, "ens_diamond": 10, "ens_scale": 10, "add_sub": 20}
    client.close()


def test_nested_ensemble_errors_name_the_inner_step(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_nested")
    bad = httpclient.InferInput("X", [4], "FP32")
    bad.set_data_from_numpy(np.ones(4, dtype=np.float32))
    # A tensor of the right shape but a request for an output the outer ensemble lacks.
    with pytest.raises(InferenceServerException, match="unexpected inference output 'SUM'"):
        client.infer("ens_nested", [bad], outputs=[httpclient.InferRequestedOutput("SUM")])
    client.close()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "ens_cycle_a",
            r"ensemble 'ens_cycle_b' contains itself \('ens_cycle_b' -> 'ens_cycle_a' -> "
            r"'ens_cycle_b'\)",
        ),
        (
            "ens_bad_shape",
            r"ensemble 'ens_bad_shape' tensor 'X' has shape \[3\] but 'X' of model "
            r"'ens_diamond' has shape \[4\]",
        ),
        (
            "ens_outer_unknown",
            r"its step model 'ens_inner_unknown' failed to load: .*its step model "
            r"'no_such_model' failed to load: failed to load 'no_such_model', failed to poll",
        ),
    ],
)
def test_nested_ensemble_problems_fail_the_load(server, model, expected):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match=expected):
        client.load_model(model)
    assert not client.is_model_ready(model)
    client.close()


def _model_stats(client, model):
    return client.get_inference_statistics(model)["model_stats"][0]


def test_an_ensemble_request_counts_as_one_execution_of_its_steps_compute(server):
    # Triton counts an answered ensemble request as one execution of its batch size whose
    # compute times are the sums of its steps'; clients read execution_count and batch_stats
    # of an ensemble as of any model (Triton's sequence QA does).
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_nested")
    before = {m: _model_stats(client, m) for m in ("ens_nested", "ens_diamond")}
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    for _ in range(5):
        client.infer("ens_nested", [_x(x)])
    for model, old in before.items():
        stats = _model_stats(client, model)
        assert int(stats["execution_count"]) - int(old["execution_count"]) == 5, model
        (batch,) = stats["batch_stats"]
        assert int(batch["batch_size"]) == 1
        assert int(batch["compute_infer"]["count"]) == int(stats["execution_count"])
        infer = stats["inference_stats"]
        assert int(infer["compute_infer"]["ns"]) > 0, model  # its steps' time, not 0
        assert int(batch["compute_infer"]["ns"]) == int(infer["compute_infer"]["ns"])
    # The outer ensemble's compute holds the nested one's.
    outer = _model_stats(client, "ens_nested")["inference_stats"]["compute_infer"]["ns"]
    inner = _model_stats(client, "ens_diamond")["inference_stats"]["compute_infer"]["ns"]
    assert int(outer) > int(inner) - int(
        before["ens_diamond"]["inference_stats"]["compute_infer"]["ns"]
    )
    client.close()


def _seq_in(value):
    inp = httpclient.InferInput("IN", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return inp


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {},
            "in ensemble 'ens_seq', inference request to model 'seq_direct' must specify a "
            "non-zero or non-empty correlation ID",
        ),
        (
            {"sequence_id": 7},
            "in ensemble 'ens_seq', inference request for sequence 7 to model 'seq_direct' "
            "must specify the START flag on the first request of the sequence",
        ),
    ],
)
def test_a_step_refused_by_its_scheduler_fails_worded_as_triton(server, flags, expected):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_seq")
    with pytest.raises(InferenceServerException) as raised:
        client.infer("ens_seq", [_seq_in(1)], **flags)
    assert raised.value.message().startswith(expected), raised.value.message()
    # A sequence that starts runs through the ensemble.
    for value, start, end in ((1, True, False), (2, False, False), (3, False, True)):
        result = client.infer(
            "ens_seq", [_seq_in(value)], sequence_id=9, sequence_start=start, sequence_end=end
        )
    assert result.as_numpy("OUT").tolist() == [[6]]
    client.close()


def test_an_ensemble_response_carries_the_sequence_id_and_flags(server):
    # Triton's ensemble scheduler sets them on every response its steps made the outputs of;
    # clients of a sequence read sequence_start/sequence_end back (Triton's ensemble QA does).
    http = httpclient.InferenceServerClient(server.url)
    http.load_model("ens_seq")
    seen = []
    for start, end in ((True, False), (False, True)):
        result = http.infer(
            "ens_seq", [_seq_in(1)], sequence_id=11, sequence_start=start, sequence_end=end
        )
        seen.append(result.get_response()["parameters"])
    assert seen == [
        {"sequence_id": 11, "sequence_start": True, "sequence_end": False},
        {"sequence_id": 11, "sequence_start": False, "sequence_end": True},
    ]
    plain = http.infer("ens_diamond", [_x([1, 2, 3, 4])]).get_response()["parameters"]
    assert plain == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    http.close()
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        inp = grpcclient.InferInput("IN", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        result = grpc.infer("ens_seq", [inp], sequence_id=12, sequence_start=True)
        params = result.get_response().parameters
        assert params["sequence_id"].int64_param == 12
        assert params["sequence_start"].bool_param and not params["sequence_end"].bool_param


def test_an_output_no_step_made_is_left_out_of_the_response(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_partial")
    x = httpclient.InferInput("X", [3], "INT32")
    x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    wanted = [httpclient.InferRequestedOutput(name) for name in ("SUM", "DIFF")]
    result = client.infer("ens_partial", [x], outputs=wanted)
    assert result.as_numpy("SUM").tolist() == [2, 4, 6]
    assert result.as_numpy("DIFF") is None
    client.close()


def test_a_request_runs_only_the_steps_its_outputs_need(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_split")
    steps = ("ens_scale", "identity")
    before = {m: _success(client, m) for m in steps}
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    one = [httpclient.InferRequestedOutput("SCALED")]
    result = client.infer("ens_split", [_x(x)], outputs=one)
    np.testing.assert_array_equal(result.as_numpy("SCALED"), 2 * x)
    assert {m: _success(client, m) - before[m] for m in steps} == {"ens_scale": 1, "identity": 0}
    result = client.infer("ens_split", [_x(x)])  # every output: both steps
    np.testing.assert_array_equal(result.as_numpy("SAME"), x)
    assert {m: _success(client, m) - before[m] for m in steps} == {"ens_scale": 2, "identity": 1}
    client.close()


def _ints(name: str, values: list[int]) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.asarray(values, dtype=np.int32))
    return tensor


@pytest.mark.parametrize("given", [("A",), ("B",), ("A", "B")])
def test_a_step_runs_without_an_optional_input_not_given(server, given):
    # As in Triton: an optional input the client leaves out, and then the output step 0 does
    # not make, are absent; both steps run without them and the output is left out.
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_optional")
    before = _success(client, "optional_pair")
    values = {"A": [1, 2], "B": [7]}
    result = client.infer("ens_optional", [_ints(name, values[name]) for name in given])
    for name in ("A", "B"):
        made = result.as_numpy(f"{name}_OUT")
        if name in given:
            assert made.tolist() == values[name]
        else:
            assert made is None
    assert _success(client, "optional_pair") == before + 2
    client.close()


def test_an_absent_tensor_a_step_requires_fails_in_tritons_words(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_optional_required")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("ens_optional_required", [_ints("X", [1, 2])], request_id="r7")
    assert (
        "in ensemble 'ens_optional_required', [request id: r7] expected 2 inputs but got 1 "
        "inputs for model 'sum_only'. Got input(s) ['A'], but missing required input(s) ['B']. "
        "Please provide all required input(s)."
    ) in str(caught.value)
    result = client.infer("ens_optional_required", [_ints("X", [1, 2]), _ints("Y", [3, 4])])
    assert result.as_numpy("SUM").tolist() == [4, 6]
    client.close()


def _metric(server, family: str, model: str, labels: str = "") -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf'^{family}\{{model="{model}",{labels}version="1"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _floats(count: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("X", [count], "FP32")
    tensor.set_data_from_numpy(np.ones(count, dtype=np.float32))
    return tensor


def test_an_output_that_cannot_be_classified_counts_once_as_a_failure(server):
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("ens_split")

    def counts():
        stats = _model_stats(client, "ens_split")["inference_stats"]
        return (
            int(stats["success"]["count"]),
            int(stats["fail"]["count"]),
            _metric(server, "nv_inference_request_success", "ens_split"),
            _metric(server, "nv_inference_request_failure", "ens_split", 'reason="OTHER",'),
        )

    before = counts()
    wanted = [httpclient.InferRequestedOutput("SCALED", class_count=1)]
    with pytest.raises(InferenceServerException, match="classification output tensor too large"):
        client.infer("ens_split", [_floats(1_000_001)], outputs=wanted)
    after = counts()
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 1, 0, 1]
    client.close()
