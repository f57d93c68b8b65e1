"""The per-model summary the request checks read: built once from the config, same verdicts."""

from __future__ import annotations

import pytest

from shoal.config import load_model_config
from shoal.core.errors import InvalidArgument
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.ipc.arena import OwnedArena
from shoal.supervisor.requests import staging
from shoal.supervisor.requests.summary import ModelSummary

UNBATCHED = """
name: "n"
backend: "python"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ -1, 3 ] },
  { name: "O" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } optional: true },
  { name: "B" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "Z" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""

BATCHED = UNBATCHED.replace('name: "n"', 'name: "b"').replace(
    "max_batch_size: 0", "max_batch_size: 4"
)


def _summary(tmp_path, text):
    model = tmp_path / text.split('"')[1]
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text(text)
    return ModelSummary(load_model_config(model))


def _tensor(name, datatype, shape):
    return InferInput(name, datatype, tuple(shape), b"")


def _request(model, *inputs, outputs=(), id=""):
    return InferRequest(
        model, id=id, inputs=list(inputs), outputs=[RequestedOutput(n) for n in outputs]
    )


def test_the_summary_holds_what_the_checks_read(tmp_path):
    unbatched = _summary(tmp_path, UNBATCHED)
    assert (unbatched.name, unbatched.max_batch_size) == ("n", 0)
    assert list(unbatched.inputs) == ["A", "O", "B"]  # the configuration's order
    assert unbatched.required == ["A", "B"]
    assert unbatched.outputs == ["Y", "Z"] and unbatched.output_names == {"Y", "Z"}
    a, o = unbatched.inputs["A"], unbatched.inputs["O"]
    assert (a.datatype, a.expected, a.optional, a.reshape) == ("FP32", (-1, 3), False, None)
    assert (o.datatype, o.expected, o.optional, o.reshape) == ("INT32", (4,), True, (2, 2))
    batched = _summary(tmp_path, BATCHED)
    assert batched.max_batch_size == 4
    assert batched.inputs["A"].expected == (-1, -1, 3)  # the batch dimension first
    assert batched.inputs["O"].expected == (-1, 4)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            [_tensor("A", "FP32", (5, 3))],
            "[request id: r1] expected number of inputs between 2 and 3 but got 1 inputs for "
            "model 'n'. Got input(s) ['A'], but missing required input(s) ['B']. Please provide"
            " all required input(s).",
        ),
        (
            [_tensor("A", "FP32", (5, 3)), _tensor("O", "INT32", (4,))],
            "[request id: r1] expected number of inputs between 2 and 3 but got 2 inputs for "
            "model 'n'. Got input(s) ['A','O'], but missing required input(s) ['B']. Please provide"
            " all required input(s).",
        ),
        (
            [_tensor("A", "FP32", (5, 3)), _tensor("C", "INT64", (1,))],
            "unexpected inference input 'C' for model 'n'",
        ),
        (
            [_tensor("A", "FP32", (5, 3)), _tensor("B", "INT32", (1,))],
            "[request id: r1] inference input 'B' data-type is 'INT32', but model 'n' expects "
            "'INT64'",
        ),
        (
            [_tensor("A", "FP32", (5, 4)), _tensor("B", "INT64", (1,))],
            "[request id: r1] unexpected shape for input 'A' for model 'n'. Expected [-1,3], got "
            "[5,4]. ",
        ),
        (
            [_tensor("A", "FP32", (1, 3)), _tensor("B", "INT64", (1,))] * 2,
            "[request id: r1] expected number of inputs between 2 and 3 but got 4 inputs for "
            "model 'n'. Got input(s) ['A','B','A','B'], and input(s) ['A','B'] more than once.",
        ),
    ],
)
def test_an_unbatched_model_s_verdicts_word_for_word(tmp_path, inputs, message):
    with pytest.raises(InvalidArgument) as info:
        staging.check_inputs(_summary(tmp_path, UNBATCHED), _request("n", *inputs, id="r1"))
    assert str(info.value) == message


def test_a_batched_model_checks_the_batch_size_and_the_batch_dimension(tmp_path):
    summary = _summary(tmp_path, BATCHED)
    good = _request("b", _tensor("A", "FP32", (4, 7, 3)), _tensor("B", "INT64", (4, 1)))
    staging.check_inputs(summary, good)
    assert staging.batch_size(summary, good) == 4
    over = _request("b", _tensor("A", "FP32", (5, 7, 3)), _tensor("B", "INT64", (5, 1)))
    with pytest.raises(InvalidArgument) as info:
        staging.check_inputs(summary, over)
    assert str(info.value) == (
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'b'"
    )
    flat = _request("b", _tensor("A", "FP32", ()), _tensor("B", "INT64", (1, 1)))
    with pytest.raises(InvalidArgument, match="'A' has no shape but model requires batch dim"):
        staging.check_inputs(summary, flat)


def test_outputs_and_the_batch_size_of_an_unbatched_model(tmp_path):
    summary = _summary(tmp_path, UNBATCHED)
    assert staging.check_outputs(summary, _request("n")) == ["Y", "Z"]
    assert staging.check_outputs(summary, _request("n", outputs=["Z"])) == ["Z"]
    with pytest.raises(InvalidArgument) as info:
        staging.check_outputs(summary, _request("n", outputs=["Z", "Q"]))
    assert str(info.value) == "unexpected inference output 'Q' for model 'n'"
    request = _request("n", _tensor("A", "FP32", (5, 3)), _tensor("B", "INT64", (1,)))
    assert staging.batch_size(summary, request) == 1


def test_an_unbatched_model_s_reshape_replaces_the_whole_shape(tmp_path):
    summary = _summary(tmp_path, UNBATCHED)
    request = _request(
        "n",
        InferInput("A", "FP32", (1, 3), bytes(12)),
        InferInput("O", "INT32", (4,), bytes(16)),
        InferInput("B", "INT64", (1,), bytes(8)),
    )
    staging.check_inputs(summary, request)
    with OwnedArena(0, initial_bytes=1 << 16) as arena:
        record, blocks = staging.stage_request(summary, request, arena, ["Y"])
        assert [d.shape for d in record.inputs] == [(1, 3), (2, 2), (1,)]
        for block in blocks:
            arena.free(block)
