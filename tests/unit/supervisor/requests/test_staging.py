"""Request checks against a model's config, and staging of inputs into a real arena."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.config import load_model_config
from shoal.core.errors import InvalidArgument, ResourceExhausted
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.ipc.arena import OwnedArena
from shoal.ipc.dtypes import serialize_bytes
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


def test_stage_copies_inputs_and_applies_reshape(config, arena):
    values = np.arange(8, dtype=np.int32).reshape(2, 4)
    text = np.array([b"ab", b"c"], dtype=np.object_)
    request = _request(
        _fp32("A", (1, 2), [[1.5, 2.5]]),
        InferInput("S", "BYTES", (1, 2), serialize_bytes(text)),
        InferInput("R", "INT32", (2, 4), values.tobytes()),
    )
    record, blocks = staging.stage_request(config, request, arena, ["Y"])
    assert len(blocks) == 3 and all(b.offset % 64 == 0 for b in blocks)
    descs = {d.name: d for d in record.inputs}
    assert descs["R"].shape == (2, 2, 2)  # batch dim kept, dims reshaped as the model sees them
    assert bytes(arena.view(descs["A"].location)) == np.float32([1.5, 2.5]).tobytes()
    assert bytes(arena.view(descs["R"].location)) == values.tobytes()
    assert record.requested_outputs == ["Y"]
    for block in blocks:
        arena.free(block)
    assert arena.used_bytes == 0


def test_byte_size_mismatch(config, arena):
    request = _request(InferInput("A", "FP32", (1, 2), b"\0" * 4))
    with pytest.raises(InvalidArgument, match="Expected 8, got 4"):
        staging.stage_request(config, request, arena, ["Y"])


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
