"""The plain reply's cached pieces: a reply written from them is what protobuf writes, call after
call, as the model, the output's shape, datatype and name change, and when the cache fills."""

from __future__ import annotations

import pytest

from shoal.core import InferOutput, InferResponse
from shoal.frontends.grpc._reply import CACHE_LIMIT, plain_reply
from shoal.frontends.grpc._wire import JOIN_BELOW
from shoal.frontends.grpc.infer_call import LEND_FROM
from shoal.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)


def _expected(response: InferResponse) -> bytes:
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for output in response.outputs:
        message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        message.raw_output_contents.append(bytes(output.data))
    return message.SerializeToString()


def _reply_of(response: InferResponse) -> bytes:
    chunks = plain_reply(response, frozenset())
    assert chunks is not None
    return b"".join(chunks)


def _response(
    shape: tuple[int, ...], datatype: str = "FP32", name: str = "OUT", model: str = "m"
) -> InferResponse:
    size = 4 if datatype == "FP32" else 1
    count = 1
    for dim in shape:
        count *= dim
    data = memoryview(bytes(index % 251 for index in range(size * count)))
    return InferResponse(model, "1", "", [InferOutput(name, datatype, shape, data)])


def test_a_reply_follows_the_outputs_layout_from_call_to_call() -> None:
    layouts = [
        ((1, 16), "FP32", "OUT", "m"),
        ((1, 16), "FP32", "OUT", "m"),  # from the cache
        ((2, 16), "FP32", "OUT", "m"),  # another shape
        ((1, 16), "UINT8", "OUT", "m"),  # another datatype, same shape
        ((1, 16), "FP32", "OTHER", "m"),  # another name
        ((1, 16), "FP32", "OUT", "n"),  # another model
        ((), "FP32", "OUT", "m"),  # a scalar: no shape field
        ((1, 200), "UINT8", "OUT", "m"),  # a raw entry of more than 127 bytes
        ((1, 16), "FP32", "OUT", "m"),  # back to the first
    ]
    for shape, datatype, name, model in layouts:
        response = _response(shape, datatype, name, model)
        assert _reply_of(response) == _expected(response), (shape, datatype, name, model)


def test_a_reply_carries_each_calls_own_id() -> None:
    for request_id in ["a", "", "b" * 300]:
        response = _response((1, 4))
        response.id = request_id
        assert _reply_of(response) == _expected(response)


def test_layouts_that_are_not_plain_stay_with_protobuf_each_time() -> None:
    negative = _response((1, 4))
    negative.outputs[0].shape = (-1, 4)
    surrogate = _response((1, 4), name="\ud800")
    bad_model = _response((1, 4), model="\ud800")
    for _ in range(2):  # the second time from the cache
        assert plain_reply(negative, frozenset()) is None
        assert plain_reply(surrogate, frozenset()) is None
        assert plain_reply(bad_model, frozenset()) is None


def test_an_output_in_shared_memory_gets_an_empty_entry() -> None:
    response = _response((1, 4))
    chunks = plain_reply(response, frozenset({"OUT"}))
    assert chunks is not None
    message = pb.ModelInferResponse.FromString(b"".join(chunks))
    assert list(message.raw_output_contents) == [b""]
    assert list(message.outputs[0].shape) == [1, 4]


def test_replies_stay_right_across_the_cache_being_cleared() -> None:
    for dim in range(CACHE_LIMIT + 10):
        response = _response((1, dim % 2000 + 1), "UINT8")
        assert _reply_of(response) == _expected(response)


def test_a_small_reply_is_one_chunk_a_large_output_stays_a_view() -> None:
    """Small outputs are joined with the rest (every caller joins them: none is lent); an
    output of JOIN_BELOW bytes or more stays a view of the response's memory, to be lent."""
    assert LEND_FROM >= JOIN_BELOW  # else an output between the two would not be lent
    small = _response((1, 16))
    chunks = plain_reply(small, frozenset())
    assert chunks is not None and len(chunks) == 1 and isinstance(chunks[0], bytes)
    assert chunks[0] == _expected(small)
    large = _response((1, JOIN_BELOW), "UINT8")
    large.outputs.append(InferOutput("SMALL", "UINT8", (1, 3), memoryview(b"abc")))
    chunks = plain_reply(large, frozenset())
    assert chunks is not None and b"".join(chunks) == _expected(large)
    data = large.outputs[0].data
    assert isinstance(data, memoryview)
    assert any(isinstance(chunk, memoryview) and chunk.obj is data.obj for chunk in chunks)


def _outputs(layout: list[tuple[str, str, tuple[int, ...]]]) -> InferResponse:
    outputs = [
        InferOutput(name, datatype, shape, memoryview(bytes(max(0, _size(datatype, shape)))))
        for name, datatype, shape in layout
    ]
    return InferResponse("m", "1", "", outputs)


def _size(datatype: str, shape: tuple[int, ...]) -> int:
    count = 4 if datatype == "FP32" else 1
    for dim in shape:
        count *= dim
    return count


def test_each_position_of_a_reply_follows_its_output_from_call_to_call() -> None:
    """The last field kept per position (outputs of one model in one order) never stands in
    for another output: swapped, renamed, reshaped, fewer, more than are kept apart."""
    many = [(f"OUT{index}", "UINT8", (1, index + 1)) for index in range(20)]
    layouts = [
        [("A", "FP32", (1, 4)), ("B", "UINT8", (2,))],
        [("A", "FP32", (1, 4)), ("B", "UINT8", (2,))],  # the same, from the last fields
        [("B", "UINT8", (2,)), ("A", "FP32", (1, 4))],  # swapped
        [("A", "FP32", (1, 5)), ("B", "FP32", (2,))],  # another shape, another datatype
        [("A", "FP32", (1, 4))],  # fewer
        many,
        many,
        [("OUT0", "UINT8", (1, 1)), ("B", "UINT8", (2,))],
        [("A", "FP32", (1, 4)), ("B", "UINT8", (2,))],
    ]
    for layout in layouts:
        response = _outputs(layout)
        assert _reply_of(response) == _expected(response), layout
    negative = _outputs([("A", "FP32", (1, 4)), ("B", "UINT8", (-2,))])
    assert plain_reply(negative, frozenset()) is None  # left to protobuf, each time
    assert plain_reply(negative, frozenset()) is None
    response = _outputs([("A", "FP32", (1, 4)), ("B", "UINT8", (2,))])
    assert _reply_of(response) == _expected(response)
