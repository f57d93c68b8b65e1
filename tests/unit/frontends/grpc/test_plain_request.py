"""Plain ModelInfer requests read without protobuf (``_plain_request``): the same fields as
protobuf reads, the same request and the same errors as the protobuf path, and everything
else left to protobuf."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.core import InvalidArgument
from shoal.frontends.grpc._infer import decode_infer_request
from shoal.frontends.grpc._plain_request import PLAIN_MAX_BYTES, read_plain, read_plain_message
from shoal.frontends.grpc._wire import encode_varint, field_header, split_raw_contents
from shoal.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)

_RAW = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER


def _request(inputs: int = 1, **fields: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32", **fields)
    for index in range(inputs):
        request.inputs.add(name=f"INPUT{index}", datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    request.outputs.add(name="OUTPUT0")
    return request


def _string(number: int, value: bytes) -> bytes:
    return field_header(number, len(value)) + value


def _header(wire: bytes) -> bytes:
    return bytes(split_raw_contents(wire, _RAW)[0])


_UNPACKED_SHAPE = _string(1, b"m") + _string(
    5, _string(1, b"X") + _string(2, b"INT8") + b"\x18\x02" + b"\x18" + encode_varint(2**64 - 3)
)
_REPEATED_NAME = _string(1, b"first") + _string(1, b"second") + _string(6, _string(1, b"O"))


@pytest.mark.parametrize(
    "header",
    [
        _header(_request().SerializeToString()),
        _header(_request(3, model_version="2", id="req-é").SerializeToString()),
        pb.ModelInferRequest(model_name="mödel").SerializeToString(),
        pb.ModelInferRequest(inputs=[pb.ModelInferRequest.InferInputTensor()]).SerializeToString(),
        pb.ModelInferRequest(
            inputs=[pb.ModelInferRequest.InferInputTensor(name="W", shape=[2**62, -7, 0])]
        ).SerializeToString(),
        b"",
        _UNPACKED_SHAPE,
        _REPEATED_NAME,
    ],
    ids=["one", "three", "no-inputs", "empty-input", "wide-dims", "empty", "unpacked", "repeated"],
)
def test_a_plain_request_reads_as_protobuf_reads_it(header: bytes) -> None:
    plain = read_plain(header)
    assert plain is not None
    theirs = pb.ModelInferRequest.FromString(header)
    assert (plain.model_name, plain.model_version, plain.id) == (
        theirs.model_name,
        theirs.model_version,
        theirs.id,
    )
    assert [(t.name, t.datatype, t.shape) for t in plain.inputs] == [
        (t.name, t.datatype, list(t.shape)) for t in theirs.inputs
    ]
    assert plain.outputs == [o.name for o in theirs.outputs]


def _not_plain() -> list[bytes]:
    with_parameter = _request()
    with_parameter.parameters["p"].int64_param = 1
    input_parameter = _request()
    input_parameter.inputs[0].parameters["shared_memory_region"].string_param = "r"
    contents = _request()
    contents.inputs[0].contents.fp32_contents.extend([1.0])
    output_parameter = _request()
    output_parameter.outputs[0].parameters["binary_data"].bool_param = True
    whole = _request().SerializeToString()
    return [
        _header(with_parameter.SerializeToString()),
        _header(input_parameter.SerializeToString()),
        _header(contents.SerializeToString()),
        _header(output_parameter.SerializeToString()),
        whole,  # raw contents left in: a message too long to walk
        _header(whole) + b"\x48\x01",  # an unknown field (9, a varint)
        _string(1, b"\xff\xfe"),  # not UTF-8
        _string(5, _string(1, b"\xc3")),
        _header(whole)[:-3],  # cut off
        b"\x0a\x80",  # a length cut off
        b"\x08\x01",  # model_name as a varint
        b"\x0a" + b"\xff" * 11,  # a varint of more than ten bytes
        _string(1, b"m" * PLAIN_MAX_BYTES),
    ]


@pytest.mark.parametrize("header", _not_plain())
def test_anything_else_is_left_to_protobuf(header: bytes) -> None:
    assert read_plain(header) is None


def test_a_plain_request_decodes_with_zero_copy_tensors() -> None:
    wire = _request(2, model_version="1", id="7").SerializeToString()
    assert read_plain(_header(wire)) is not None
    decoded = decode_infer_request(wire)
    request = decoded.request
    assert (request.model_name, request.model_version, request.id) == ("identity_fp32", "1", "7")
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in request.inputs] == [
        ("INPUT0", "FP32", (1, 16), {}),
        ("INPUT1", "FP32", (1, 16), {}),
    ]
    for tensor in request.inputs:
        assert isinstance(tensor.data, memoryview) and tensor.data.readonly
        assert tensor.data.obj is wire
        assert bytes(tensor.data) == np.arange(16, dtype=np.float32).tobytes()
    assert [(o.name, o.parameters) for o in request.outputs] == [("OUTPUT0", {})]
    assert request.parameters == {}
    assert (decoded.shared_memory_outputs, decoded.final_response_flag) == (frozenset(), False)


def _broken(kind: str) -> pb.ModelInferRequest:
    request = _request(2)
    break_second_input(request, kind)
    break_raw_contents(request, kind)
    return request


def break_second_input(request: pb.ModelInferRequest, kind: str) -> None:
    """Spoil the second input's fields as ``kind`` says: a duplicate name, no name, an unknown
    datatype, a negative dimension; any other kind leaves them whole."""
    tensor = request.inputs[1]
    if kind == "duplicate":
        tensor.name = "INPUT0"
    elif kind == "no-name":
        tensor.name = ""
    elif kind == "datatype":
        tensor.datatype = "FP8"
    elif kind == "negative":
        tensor.shape[0] = -1


def break_raw_contents(request: pb.ModelInferRequest, kind: str) -> None:
    """Spoil the raw contents of ``request`` (of two inputs or more) as ``kind`` says: the
    second input's missing, one more, the second of the wrong size, none at all; any other
    kind leaves them whole."""
    if kind == "missing":
        del request.raw_input_contents[1]
    elif kind == "extra":
        request.raw_input_contents.append(b"")
    elif kind == "size":
        request.raw_input_contents[1] = b"\0" * 8
    elif kind == "none":
        del request.raw_input_contents[:]


@pytest.mark.parametrize(
    "kind", ["duplicate", "no-name", "datatype", "negative", "missing", "extra", "size", "none"]
)
def test_a_plain_request_fails_word_for_word_as_through_protobuf(kind: str) -> None:
    plain = _broken(kind)
    assert read_plain(_header(plain.SerializeToString())) is not None
    parsed = _broken(kind)
    parsed.parameters["p"].int64_param = 1  # not plain: protobuf reads it
    with pytest.raises(InvalidArgument) as theirs:
        decode_infer_request(parsed.SerializeToString())
    with pytest.raises(InvalidArgument) as ours:
        decode_infer_request(plain.SerializeToString())
    assert str(ours.value) == str(theirs.value)


def _whole_messages() -> list[bytes]:
    header, entries = split_raw_contents(_request(2).SerializeToString(), _RAW)
    name = len(_string(1, b"identity_fp32"))  # the model name's field, first
    return [
        _request().SerializeToString(),
        _request(3, model_version="2", id="req-é").SerializeToString(),
        _request(0).SerializeToString(),
        # raw contents first, and an empty entry between the fields: any order is a message
        b"".join(_string(_RAW, bytes(entry)) for entry in entries) + bytes(header),
        bytes(header[:name]) + _string(_RAW, b"") + bytes(header[name:]),
        _UNPACKED_SHAPE + _string(_RAW, b"\x01\x02"),
        b"",
    ]


@pytest.mark.parametrize(
    "wire",
    _whole_messages(),
    ids=["one", "three", "no-inputs", "raw-first", "raw-between", "unpacked", "empty"],
)
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_small_message_reads_in_one_walk_as_in_two(wire: bytes, kind: type) -> None:
    """read_plain_message gives what split_raw_contents and read_plain give, the entries as
    read-only views of the message as received, whatever its type."""
    message = kind(bytearray(wire)) if kind is memoryview else kind(wire)
    walked = read_plain_message(message)
    assert walked is not None
    ours, entries = walked
    header, raw = split_raw_contents(wire, _RAW)
    theirs = read_plain(header)
    assert theirs is not None
    assert (ours.model_name, ours.model_version, ours.id, ours.outputs) == (
        theirs.model_name,
        theirs.model_version,
        theirs.id,
        theirs.outputs,
    )
    assert [(t.name, t.datatype, t.shape) for t in ours.inputs] == [
        (t.name, t.datatype, t.shape) for t in theirs.inputs
    ]
    assert [bytes(entry) for entry in entries] == [bytes(entry) for entry in raw]
    for entry in entries:
        assert entry.readonly
        assert entry.obj is (message.obj if isinstance(message, memoryview) else message)


@pytest.mark.parametrize(
    "wire",
    [
        *_not_plain()[:4],  # parameters and typed contents, raw contents cut out
        *(whole for whole in _not_plain()[5:]),  # unknown fields, not UTF-8, malformed
        _string(_RAW, b"\0" * PLAIN_MAX_BYTES),  # too large to be read whole
        b"\x38\x01",  # raw contents as a varint
    ],
)
def test_anything_else_is_split_and_read_as_before(wire: bytes) -> None:
    assert read_plain_message(wire) is None


def test_a_small_request_decodes_in_one_walk() -> None:
    wire = _request(2, model_version="1", id="7").SerializeToString()
    assert read_plain_message(wire) is not None
    request = decode_infer_request(bytearray(wire)).request
    assert [(t.name, t.shape, bytes(t.data)) for t in request.inputs] == [
        (f"INPUT{index}", (1, 16), np.arange(16, dtype=np.float32).tobytes()) for index in (0, 1)
    ]
    assert all(isinstance(t.data, memoryview) and t.data.readonly for t in request.inputs)
