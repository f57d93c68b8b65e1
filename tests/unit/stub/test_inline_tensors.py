"""Small tensors inside the Execute and Result: what the stub's models see and send back.

The Execute crosses the wire form (``msg.encode``/``decode``) as on a ring, and the inputs are
read through the runtime's own view functions; the Result's records are what the core reads.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from shoal.ipc import messages as msg
from shoal.ipc import whole_results
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.dtypes import DATATYPES, byte_size, deserialize_bytes, serialize_bytes
from shoal.ipc.tensor import (
    INLINE_TENSOR_MAX,
    InlineBytes,
    TensorDesc,
    buffer_to_numpy,
    inline_budget,
)
from shoal.stub import pb_utils
from shoal.stub.executor import BatchExecutor
from shoal.stub.inline_inputs import inline_array
from shoal.stub.memory import Locations, SharedOutputArena
from shoal.stub.runtime import StubRuntime
from shoal.stub.tensors_out import TensorWriter

#: The runtime's views of an input; an inline one needs nothing of the runtime's state (its
#: segments and regions are for the other kinds).
_RUNTIME = types.SimpleNamespace()


def _input_view(location):
    return StubRuntime.input_view(_RUNTIME, location)  # type: ignore[arg-type]


def _private_view(location, view):
    return StubRuntime.private_input_view(_RUNTIME, location, view)  # type: ignore[arg-type]


class _Model:
    """Runs ``body(request)`` for each request and answers with what it returns."""

    def __init__(self, body):
        self.body = body
        self.seen: list = []

    def execute(self, requests):
        return [pb_utils.InferenceResponse(self.body(self, r)) for r in requests]


@pytest.fixture
def arena():
    arena = OwnedArena(7, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20)
    yield arena
    arena.close()


def _run(model, arena, inputs, budget=None):
    writer = TensorWriter(SharedOutputArena(arena), Locations())
    if budget is not None:
        writer.inline_budget = budget
    executor = BatchExecutor(
        "m_0", model, writer, _input_view, lambda m: None, False, _private_view
    )
    record = msg.RequestRecord("r", 0, 0, {}, [], inputs, key=1)
    sent = msg.decode(msg.encode(msg.Execute(1, [record])))  # as the stub reads its ring
    result = executor.run(sent)
    assert result is not None
    wire = msg.decode(msg.encode(result))  # as the core reads it
    assert isinstance(wire, msg.Result) and isinstance(sent, msg.Execute)
    if wire.wholes is not None:  # every output inline: the Result went whole
        return sent, whole_results.response_of(wire.wholes[0])
    return sent, wire.responses[0]


def _inline(name, array, datatype="FP32"):
    data = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
    return TensorDesc(name, datatype, array.shape, InlineBytes(data))


def test_a_model_may_write_an_inline_input_and_return_it(arena):
    def body(model, request):
        array = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        array *= 2  # Triton's inputs are the model's own: writable
        return [pb_utils.Tensor("OUT", array)]

    sent, response = _run(_Model(body), arena, [_inline("IN", np.float32([[1, 2, 3]]))])
    assert response.error is None
    out = response.outputs[0]
    assert type(out.location) is InlineBytes and out.shape == (1, 3)
    assert np.frombuffer(out.location.data, np.float32).tolist() == [2, 4, 6]
    assert sent.requests[0].inputs[0].location.data == np.float32([1, 2, 3]).tobytes()
    assert arena.used_bytes == 0  # no output block


def test_an_input_returned_unchanged_goes_back_inline_and_to_dlpack_works(arena):
    def body(model, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "IN")
        model.seen.append(pb_utils.Tensor.from_dlpack("COPY", tensor.to_dlpack()).as_numpy())
        return [pb_utils.Tensor("OUT", tensor.as_numpy())]

    model = _Model(body)
    _, response = _run(model, arena, [_inline("IN", np.int64([[7, 8]]), "INT64")])
    assert response.outputs[0].location == InlineBytes(np.int64([7, 8]).tobytes())
    assert model.seen[0].tolist() == [[7, 8]]


def test_bytes_inputs_and_outputs_inline(arena):
    def body(model, request):
        words = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        return [pb_utils.Tensor("OUT", np.array([w + b"!" for w in words.flat], np.object_))]

    words = np.array([b"ab", b"", b"\xff\x00"], np.object_)
    _, response = _run(_Model(body), arena, [_inline("IN", words, "BYTES")])
    out = response.outputs[0]
    assert out.datatype == "BYTES" and type(out.location) is InlineBytes
    assert deserialize_bytes(out.location.data, 3).tolist() == [b"ab!", b"!", b"\xff\x00!"]


def test_past_the_tensor_limit_or_the_budget_outputs_take_blocks(arena):
    def body(model, request):
        small = np.zeros(INLINE_TENSOR_MAX // 4, np.float32)  # exactly the limit
        return [
            pb_utils.Tensor("A", small),
            pb_utils.Tensor("B", np.zeros(INLINE_TENSOR_MAX // 4 + 1, np.float32)),  # past it
            pb_utils.Tensor("C", np.ones(4, np.float32)),  # 16 bytes: left over budget?
        ]

    _, response = _run(_Model(body), arena, [], budget=INLINE_TENSOR_MAX + 8)
    kinds = [type(o.location) for o in response.outputs]
    assert kinds == [InlineBytes, Block, Block]  # C would pass the budget after A
    _, response = _run(_Model(body), arena, [], budget=INLINE_TENSOR_MAX + 16)
    assert [type(o.location) for o in response.outputs] == [InlineBytes, Block, InlineBytes]


def test_a_result_of_a_full_batch_fits_the_message_cap(arena):
    for max_batch_size in (0, 4, 256, 100_000):
        assert inline_budget(max_batch_size) * max(1, max_batch_size) <= (1 << 20) // 4


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
@pytest.mark.parametrize("shape", [(16,), (1, 16), (4, 2, 2), (), (0,), (2, 0, 3), (1,) * 20])
def test_an_inline_input_is_the_array_buffer_to_numpy_makes(datatype, shape):
    """``inline_array``: the same writable array, of its own copy of the bytes."""
    data = bytes(range(256))[: byte_size(datatype, shape)]
    mine = inline_array(datatype, shape, data)
    theirs = buffer_to_numpy(datatype, shape, bytearray(data), readonly=False)
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    assert mine.tobytes() == theirs.tobytes() == data
    assert mine.flags.writeable
    if mine.size:
        mine.flat[0] = 1  # the model's own copy: the message's bytes stay as they are
    assert data == bytes(range(256))[: len(data)]


@pytest.mark.parametrize(
    ("datatype", "shape", "size"),
    [("FP32", (16,), 60), ("FP32", (-16,), 64), ("INT8", (2, -2), 4), ("NOPE", (1,), 4)],
)
def test_an_inline_input_of_a_wrong_size_fails_as_buffer_to_numpy_does(datatype, shape, size):
    with pytest.raises(ValueError) as theirs:
        buffer_to_numpy(datatype, shape, bytearray(size), readonly=False)
    with pytest.raises(ValueError) as mine:
        inline_array(datatype, shape, bytes(size))
    assert str(mine.value) == str(theirs.value)


def test_a_bytes_inline_input_is_decoded():
    words = np.array([b"ab", b""], np.object_)
    array = inline_array("BYTES", (2,), serialize_bytes(words))
    assert array.tolist() == [b"ab", b""]
