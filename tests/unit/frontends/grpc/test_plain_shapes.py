"""Repeated plain ModelInfer requests made from their remembered shape (``split_fields``,
``known_shape``): the same request as a first decode, each with its own objects and its own raw
contents checked, the same errors, and only shapes made without error remembered."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shoal.core import InvalidArgument
from shoal.frontends.grpc import _plain_request
from shoal.frontends.grpc._infer import decode_infer_request
from shoal.frontends.grpc._plain_request import (
    CheckedInput,
    PlainRequest,
    PlainShape,
    known_shape,
    remember_shape,
    split_fields,
)
from shoal.frontends.grpc._wire import field_header, split_raw_contents
from shoal.protos import grpc_service_pb2 as pb
from tests.unit.frontends.grpc.test_plain_request import break_raw_contents, break_second_input

pytestmark = pytest.mark.timeout(60)

_RAW = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER


@pytest.fixture(autouse=True)
def _no_shapes() -> Iterator[None]:
    _plain_request._SHAPES.clear()
    yield
    _plain_request._SHAPES.clear()


def _request(inputs: int = 2, start: int = 0, **fields: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32", **fields)
    for index in range(inputs):
        request.inputs.add(name=f"INPUT{index}", datatype="FP32", shape=[1, 16])
        data = np.arange(start, start + 16, dtype=np.float32)
        request.raw_input_contents.append(data.tobytes())
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    return request


def _fields(wire: bytes) -> bytes:
    split = split_fields(wire)
    assert split is not None
    return split[0]


def test_a_repeat_is_made_anew_from_its_shape() -> None:
    first_wire = _request(model_version="1", id="7").SerializeToString()
    second_wire = _request(start=100, model_version="1", id="7").SerializeToString()
    assert known_shape(_fields(first_wire)) is None
    first = decode_infer_request(first_wire).request
    assert known_shape(_fields(second_wire)) is not None
    decoded = decode_infer_request(second_wire)
    second = decoded.request
    assert (second.model_name, second.model_version, second.id) == ("identity_fp32", "1", "7")
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in second.inputs] == [
        (t.name, t.datatype, t.shape, t.parameters) for t in first.inputs
    ]
    for tensor in second.inputs:  # the second message's own bytes, not copied
        assert isinstance(tensor.data, memoryview) and tensor.data.readonly
        assert tensor.data.obj is second_wire
        assert bytes(tensor.data) == np.arange(100, 116, dtype=np.float32).tobytes()
    assert [(o.name, o.parameters) for o in second.outputs] == [
        ("OUTPUT0", {}),
        ("OUTPUT1", {}),
    ]
    assert (second.parameters, decoded.shared_memory_outputs) == ({}, frozenset())
    assert decoded.final_response_flag is False
    # Nothing shared that a request's user may change.
    assert second.inputs is not first.inputs and second.outputs is not first.outputs
    for ours, theirs in zip(second.inputs, first.inputs, strict=True):
        assert ours is not theirs and ours.parameters is not theirs.parameters
    for ours_out, theirs_out in zip(second.outputs, first.outputs, strict=True):
        assert ours_out is not theirs_out and ours_out.parameters is not theirs_out.parameters
    assert second.parameters is not first.parameters


def _broken_raw(kind: str) -> pb.ModelInferRequest:
    request = _request()
    break_raw_contents(request, kind)
    return request


@pytest.mark.parametrize("kind", ["missing", "extra", "size", "none"])
def test_a_repeat_fails_word_for_word_as_through_protobuf(kind: str) -> None:
    parsed = _broken_raw(kind)
    parsed.parameters["p"].int64_param = 1  # not plain: protobuf reads it
    with pytest.raises(InvalidArgument) as theirs:
        decode_infer_request(parsed.SerializeToString())
    decode_infer_request(_request().SerializeToString())
    wire = _broken_raw(kind).SerializeToString()
    assert known_shape(_fields(wire)) is not None
    with pytest.raises(InvalidArgument) as ours:
        decode_infer_request(wire)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "kind", ["duplicate", "no-name", "datatype", "negative", "size", "missing"]
)
def test_a_request_that_fails_is_not_remembered(kind: str) -> None:
    request = _broken_raw(kind)
    break_second_input(request, kind)
    wire = request.SerializeToString()
    for _ in range(2):  # the second time fails as the first: its fields are read again
        with pytest.raises(InvalidArgument):
            decode_infer_request(wire)
        assert known_shape(_fields(wire)) is None


def _string(number: int, value: bytes) -> bytes:
    return field_header(number, len(value)) + value


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("inputs", [0, 1, 3])
def test_split_fields_cuts_as_split_raw_contents(kind: type, inputs: int) -> None:
    wire = _request(inputs, id="x").SerializeToString()
    message = kind(bytearray(wire)) if kind is memoryview else kind(wire)
    split = split_fields(message)
    assert split is not None
    fields, entries = split
    header, raw = split_raw_contents(wire, _RAW)
    assert type(fields) is bytes and fields == bytes(header)
    assert [bytes(entry) for entry in entries] == [bytes(entry) for entry in raw]
    for entry in entries:
        assert entry.readonly
        assert entry.obj is (message.obj if isinstance(message, memoryview) else message)


def test_split_fields_leaves_other_orders_and_malformed_messages() -> None:
    header, entries = split_raw_contents(_request().SerializeToString(), _RAW)
    name = len(_string(1, b"identity_fp32"))
    raw = b"".join(_string(_RAW, bytes(entry)) for entry in entries)
    for wire in (
        raw + bytes(header),  # raw contents first
        bytes(header[:name]) + _string(_RAW, b"") + bytes(header[name:]),  # between
        _string(_RAW, b"\0" * _plain_request.PLAIN_MAX_BYTES),  # too large
        b"\x38\x01",  # raw contents as a varint
        bytes(header) + b"\x3a\x05ab",  # cut off
    ):
        assert split_fields(wire) is None
    # Read whole instead, as before: the same request.
    request = decode_infer_request(raw + bytes(header)).request
    assert [bytes(t.data) for t in request.inputs] == [bytes(entry) for entry in entries]


def test_remembered_shapes_are_bounded() -> None:
    shape = PlainShape(PlainRequest(), [CheckedInput("X", "FP32", (1,))])
    remember_shape(b"m" * 2049, shape)
    assert known_shape(b"m" * 2049) is None
    remember_shape(b"m" * 2048, shape)
    assert known_shape(b"m" * 2048) is shape
    for index in range(1, 256):
        remember_shape(index.to_bytes(2, "big"), shape)
    assert len(_plain_request._SHAPES) == 256
    remember_shape(b"new", shape)  # full: emptied first
    assert list(_plain_request._SHAPES) == [b"new"]
