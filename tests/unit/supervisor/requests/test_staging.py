"""Request checks against a model's config, and staging of inputs into a real arena."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.config import load_model_config
from shoal.core.errors import InvalidArgument, ResourceExhausted
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.ipc.arena import OwnedArena
from shoal.ipc.dtypes import serialize_bytes
from shoal.ipc.tensor import (
    INLINE_MESSAGE_MAX,
    INLINE_REQUEST_MAX,
    INLINE_TENSOR_MAX,
    InlineBytes,
    inline_budget,
)
from shoal.supervisor.requests import staging
from shoal.supervisor.requests.summary import ModelSummary

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "R" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } optional: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture
def config(tmp_path):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text(CONFIG)
    return ModelSummary(load_model_config(model))


@pytest.fixture
def arena():
    with OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 17) as a:
        yield a


def _fp32(name, shape, values=None):
    data = np.zeros(shape, dtype=np.float32) if values is None else np.asarray(values, np.float32)
    return InferInput(name, "FP32", tuple(shape), data.tobytes())


def _request(*inputs, outputs=()):
    return InferRequest("m", inputs=list(inputs), outputs=[RequestedOutput(n) for n in outputs])


def test_valid_request_passes(config):
    staging.check_inputs(config, _request(_fp32("A", (3, 2))))
    assert staging.check_outputs(config, _request()) == ["Y"]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_request(_fp32("B", (1, 2))), "unexpected inference input 'B' for model 'm'"),
        (_request(), "missing required input(s) ['A']"),
        (
            _request(InferInput("A", "INT32", (1, 2), b"\0" * 8)),
            "inference input 'A' data-type is 'INT32', but model 'm' expects 'FP32'",
        ),
        (
            _request(_fp32("A", (1, 3))),
            "unexpected shape for input 'A' for model 'm'. Expected [-1,2], got [1,3]",
        ),
        (_request(_fp32("A", (2,))), "Expected [-1,2], got [2]"),
        (_request(_fp32("A", (9, 2))), "inference request batch-size must be <= 8 for 'm'"),
        (_request(_fp32("A", (1, 2)), _fp32("A", (1, 2))), "more than once"),
        (
            _request(InferInput("A", "FP32", (1, -2), b"")),
            "input 'A' for model 'm' has a negative dimension in its shape [1,-2]",
        ),
        (  # a zero does not hide the others' product; the negative one is named first
            _request(InferInput("A", "FP32", (1 << 30, 0, 1 << 30), b"")),
            "has an impossible shape [1073741824,0,1073741824]: its dimensions multiply past",
        ),
        (
            _request(InferInput("A", "FP32", (1 << 62, -1, 2), b"")),
            "has a negative dimension in its shape",
        ),
        (_request(_fp32("A", (0, 2))), None),  # an empty batch is a shape that matches
    ],
)
def test_invalid_requests(config, request_, message):
    if message is None:
        staging.check_inputs(config, request_)
        return
    with pytest.raises(InvalidArgument) as info:
        staging.check_inputs(config, request_)
    assert message in str(info.value)


def test_unknown_output(config):
    with pytest.raises(InvalidArgument, match="unexpected inference output 'Z' for model 'm'"):
        staging.check_outputs(config, _request(outputs=["Z"]))


def test_small_inputs_travel_inline_with_the_reshape_applied(config, arena):
    values = np.arange(8, dtype=np.int32).reshape(2, 4)
    text = np.array([b"ab", b"c"], dtype=np.object_)
    request = _request(
        _fp32("A", (1, 2), [[1.5, 2.5]]),
        InferInput("S", "BYTES", (1, 2), serialize_bytes(text)),
        InferInput("R", "INT32", (2, 4), memoryview(values.tobytes())),
    )
    record, blocks = staging.stage_request(config, request, arena, ["Y"])
    assert blocks == [] and arena.used_bytes == 0  # no block for a small tensor
    descs = {d.name: d for d in record.inputs}
    assert all(type(d.location) is InlineBytes for d in descs.values())
    assert descs["R"].shape == (2, 2, 2)  # batch dim kept, dims reshaped as the model sees them
    assert descs["A"].location.data == np.float32([1.5, 2.5]).tobytes()
    assert descs["S"].location.data == serialize_bytes(text)
    assert descs["R"].location.data == values.tobytes()
    assert record.private_inputs == 0  # (the stub copies an inline input the model may write)
    assert record.requested_outputs == ["Y"]


def test_a_json_input_is_written_inline_in_the_wire_layout(config, arena):
    values = np.array([[1, 2]], dtype=np.float64)  # converted to the input's FP32
    request = _request(InferInput("A", "FP32", (1, 2), values))
    record, blocks = staging.stage_request(config, request, arena, ["Y"])
    assert blocks == [] and record.inputs[0].location.data == np.float32([1, 2]).tobytes()


def _text(nbytes):
    """A BYTES tensor of one element whose V2 payload is ``nbytes`` long."""
    return InferInput(
        "S", "BYTES", (1, 1), serialize_bytes(np.array([b"x" * (nbytes - 4)], object))
    )


@pytest.mark.parametrize(
    ("nbytes", "inline"), [(INLINE_TENSOR_MAX, True), (INLINE_TENSOR_MAX + 1, False)]
)
def test_the_tensor_limit_is_inclusive(config, arena, nbytes, inline):
    record, blocks = staging.stage_request(
        config, _request(_fp32("A", (1, 2)), _text(nbytes)), arena, ["Y"]
    )
    location = record.inputs[1].location
    assert location.nbytes == nbytes and (type(location) is InlineBytes) is inline
    assert len(blocks) == (0 if inline else 1)
    if blocks:
        assert bytes(arena.view(blocks[0])) == bytes(_text(nbytes).data)
        arena.free(blocks[0])


def test_past_the_models_budget_the_rest_take_blocks(config, arena):
    assert (
        config.inline_budget == inline_budget(8) == min(INLINE_REQUEST_MAX, INLINE_MESSAGE_MAX // 8)
    )
    config.inline_budget = 40  # A (8 bytes) fits, S (40) would pass it: S takes a block
    record, blocks = staging.stage_request(
        config, _request(_fp32("A", (1, 2)), _text(40)), arena, ["Y"]
    )
    assert type(record.inputs[0].location) is InlineBytes
    assert record.inputs[1].location == blocks[0] and record.private_inputs == 0b10
    arena.free(blocks[0])


def test_a_batch_of_the_largest_requests_fits_the_ring():
    for max_batch_size in (0, 1, 8, 64, 1024, 1 << 20):
        assert max(1, max_batch_size) * inline_budget(max_batch_size) <= INLINE_MESSAGE_MAX
    assert inline_budget(1 << 20) == 0  # a model with huge batches: every input in a block
    from shoal.supervisor.instances.process import StubLaunch

    # a quarter of the stub's ring at most, as served
    assert StubLaunch("m_0").ring_bytes // 4 >= INLINE_MESSAGE_MAX


def test_byte_size_mismatch(config, arena):
    request = _request(InferInput("A", "FP32", (1, 2), b"\0" * 4))
    with pytest.raises(InvalidArgument, match="Expected 8, got 4"):
        staging.stage_request(config, request, arena, ["Y"])


@pytest.mark.parametrize("kind", [bytes, memoryview, bytearray, "view of floats", "array"])
def test_every_kind_of_input_data_is_sized_and_staged_alike(config, arena, kind):
    """Bytes and views are sized without a view made of them; any other buffer, and an
    array, as before: the same record bytes for each, and a buffer's size checked against
    its shape (an array's size is its own: JSON's values, shaped as they were parsed)."""
    values = np.float32([[1.5, 2.5]])

    def data(array):
        if kind == "array":
            return array
        if kind == "view of floats":  # a view whose format is not bytes
            return memoryview(array)
        return kind(array.tobytes())

    record, blocks = staging.stage_request(
        config, _request(InferInput("A", "FP32", (1, 2), data(values))), arena, ["Y"]
    )
    assert blocks == [] and record.inputs[0].location.data == values.tobytes()
    if kind == "array":
        return
    short = _request(InferInput("A", "FP32", (1, 2), data(values[:, :1])))
    with pytest.raises(InvalidArgument, match="Expected 8, got 4"):
        staging.stage_request(config, short, arena, ["Y"])


def test_broken_bytes_prefix(config, arena):
    request = _request(_fp32("A", (1, 2)), InferInput("S", "BYTES", (1, 1), b"\x09\0\0\0ab"))
    with pytest.raises(InvalidArgument, match="input 'S' for model 'm': malformed BYTES"):
        staging.stage_request(config, request, arena, ["Y"])
    assert arena.used_bytes == 0


def test_arena_exhaustion_is_a_clean_error(config, arena):
    big = InferInput("A", "FP32", (1, 2), b"\0" * 8)
    request = _request(
        big, InferInput("S", "BYTES", (1, 1), serialize_bytes(np.array([b"x" * 300_000], object)))
    )
    with pytest.raises(ResourceExhausted, match="model 'm'"):
        staging.stage_request(config, request, arena, ["Y"])
    assert arena.used_bytes == 0


def test_an_input_in_a_cuda_region_goes_by_descriptor_with_its_size_checked(config, arena):
    from shoal.ipc.tensor import CudaRegionLocation

    window = CudaRegionLocation("1:gpu", 0, 64, 24, bytes(64))  # 3 x 2 FP32
    request = _request(InferInput("A", "FP32", (3, 2), memoryview(b"")))
    record, blocks = staging.stage_request(config, request, arena, ["Y"], {"A": window})
    assert blocks == [] and record.inputs[0].location == window
    short = CudaRegionLocation("1:gpu", 0, 64, 16, bytes(64))
    with pytest.raises(InvalidArgument, match=r"input byte size mismatch for input 'A'.*got 16"):
        staging.stage_request(config, request, arena, ["Y"], {"A": short})


def test_a_large_input_takes_a_block_whose_bytes_are_the_inputs(config, arena):
    record, blocks = staging.stage_request(
        config, _request(_fp32("A", (1, 2)), _text(65536)), arena, ["Y"]
    )
    assert record.inputs[1].location == blocks[0]
    assert bytes(arena.view(blocks[0])) == bytes(_text(65536).data)
    arena.free(blocks[0])
    assert arena.used_bytes == 0


def test_an_input_a_worker_placed_goes_by_its_block_without_a_copy(config, arena):
    with OwnedArena(1 << 32, initial_bytes=1 << 16) as worker:
        block = worker.allocate(8)
        worker.view(block)[:] = np.float32([3.0, 4.0]).tobytes()
        placed = InferInput("A", "FP32", (1, 2), worker.view(block), placed=block)
        record, blocks = staging.stage_request(config, _request(placed), arena, ["Y"])
        assert blocks == [block] and record.inputs[0].location == block
        assert placed.placed is None  # the caller owns it now, as the arena's own blocks
        assert record.private_inputs == 1  # the request's own copy: the model may write it
        assert arena.used_bytes == 0


def test_a_failed_staging_hands_placed_blocks_back_to_the_request(config, arena):
    with OwnedArena(1 << 32, initial_bytes=1 << 16) as worker:
        block = worker.allocate(8)
        placed = InferInput("A", "FP32", (1, 2), worker.view(block), placed=block)
        text = serialize_bytes(np.array([b"x" * 300_000], object))
        request = _request(placed, InferInput("S", "BYTES", (1, 1), text))
        with pytest.raises(ResourceExhausted):
            staging.stage_request(config, request, arena, ["Y"])
        assert placed.placed == block  # its maker gives it back
        assert arena.used_bytes == 0


@pytest.mark.parametrize(
    ("request_id", "parameters", "named"),
    [
        ("bad\udc00id", {"k\udc01": "v\udc02"}, "bad\udc00id"),  # the id first
        ("", {"ok": "v\udc02", "k\udc01": 1}, "k\udc01"),  # then the names
        ("", {"ok": 1, "also": "v\udc02"}, "v\udc02"),  # then the string values
    ],
)
def test_a_lone_surrogate_is_named_id_then_names_then_values(config, request_id, parameters, named):
    request = InferRequest("m", id=request_id, inputs=[_fp32("A", (1, 2))], parameters=parameters)
    with pytest.raises(InvalidArgument, match="not valid UTF-8") as caught:
        staging.check_inputs(config, request)
    assert repr(named) in str(caught.value)


def test_non_ascii_text_that_is_valid_utf8_passes(config):
    request = InferRequest(
        "m", id="requête-é", inputs=[_fp32("A", (1, 2))], parameters={"clé": "värde ✓"}
    )
    staging.check_inputs(config, request)


def test_a_record_without_parameters_has_no_sequence_and_no_timeout(config, arena):
    record, blocks = staging.stage_request(config, _request(_fp32("A", (1, 2))), arena, ["Y"])
    try:
        assert (record.correlation_id, record.flags, record.timeout_us) == (0, 0, 0)
        assert record.parameters == {}
    finally:
        for block in blocks:
            arena.free(block)
    request = _request(_fp32("A", (1, 2)))
    request.parameters = {"sequence_id": 7, "sequence_start": True, "timeout": 250}
    record, blocks = staging.stage_request(config, request, arena, ["Y"])
    try:
        assert (record.correlation_id, record.flags, record.timeout_us) == (7, 1, 250)
        assert record.parameters == request.parameters
        assert record.parameters is not request.parameters
    finally:
        for block in blocks:
            arena.free(block)


def test_a_failed_staging_after_an_inline_input_hands_back_the_right_block(config, arena):
    with OwnedArena(1 << 32, initial_bytes=1 << 16) as worker:
        block = worker.allocate(16)
        placed = InferInput("R", "INT32", (1, 4), worker.view(block), placed=block)
        text = serialize_bytes(np.array([b"x" * 300_000], object))
        request = _request(_fp32("A", (1, 2)), placed, InferInput("S", "BYTES", (1, 1), text))
        with pytest.raises(ResourceExhausted):
            staging.stage_request(config, request, arena, ["Y"])
        assert placed.placed == block  # not paired with the inline input before it
        assert arena.used_bytes == 0


def test_inline_inputs_past_a_budget_move_to_blocks_of_the_same_bytes(arena):
    from shoal.ipc.tensor import TensorDesc

    inputs = [
        TensorDesc("A", "FP32", (2,), InlineBytes(np.float32([1, 2]).tobytes())),
        TensorDesc("E", "FP32", (0,), InlineBytes(b"")),
        TensorDesc("B", "INT8", (3,), InlineBytes(b"\x01\x02\x03")),
    ]
    assert staging.inline_bytes(inputs) == 11
    blocks = staging.spill_inline(inputs, arena)
    assert [d.location for d in inputs] == blocks and len(blocks) == 3
    assert bytes(arena.view(blocks[0])) == np.float32([1, 2]).tobytes()
    assert bytes(arena.view(blocks[2])) == b"\x01\x02\x03"
    assert staging.inline_bytes(inputs) == 0
    for block in blocks:
        arena.free(block)
    assert arena.used_bytes == 0


def test_a_spill_the_arena_cannot_hold_frees_what_it_took(arena):
    from shoal.ipc.tensor import TensorDesc

    inputs = [
        TensorDesc("A", "INT8", (4096,), InlineBytes(bytes(4096))),
        TensorDesc("B", "INT8", (1 << 17,), InlineBytes(bytes(1 << 17))),  # past the limit
    ]
    with pytest.raises(ResourceExhausted, match="cannot stage the inputs"):
        staging.spill_inline(inputs, arena)
    assert arena.used_bytes == 0
