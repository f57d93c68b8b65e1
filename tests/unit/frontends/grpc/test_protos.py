"""shoal's grpc_service.proto against tritonclient's: same messages, fields and numbers, the same
bytes both ways, every RPC served; and the hand-written wire handling of tensor bytes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc  # noqa: F401  (registers Triton's inference.* descriptors first)
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet
from tritonclient.grpc import service_pb2 as triton_pb

from shoal.core import InferOutput, InferResponse, InvalidArgument
from shoal.frontends.grpc._infer import (
    DecodedInfer,
    decode_infer_request,
    encode_infer_response,
    stream_error,
    stream_response_chunks,
)
from shoal.frontends.grpc._wire import MAX_WALKED_FIELDS, encode_varint, split_raw_contents
from shoal.frontends.grpc.methods import SERVICE_NAME
from shoal.protos import grpc_service_pb2 as shoal_pb
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore, serving

pytestmark = pytest.mark.timeout(60)

TRITON = triton_pb.DESCRIPTOR.package + "."
SHOAL = shoal_pb.DESCRIPTOR.package + "."


def test_both_modules_live_in_one_process() -> None:
    assert shoal_pb.ModelInferRequest.DESCRIPTOR.full_name == "shoal.inference.ModelInferRequest"
    assert triton_pb.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"


def _type_name(field: FieldDescriptor) -> str:
    target = field.message_type or field.enum_type
    if target is None:
        return ""
    return target.full_name.removeprefix(TRITON).removeprefix(SHOAL)


def _enum_shape(enum: EnumDescriptor) -> dict[str, int]:
    return {value.name: value.number for value in enum.values}


def _message_shape(message: Descriptor) -> dict[str, object]:
    return {
        "fields": {
            field.name: (field.number, field.type, field.is_repeated, _type_name(field))
            for field in message.fields
        },
        "field_order": [field.name for field in message.fields],
        "oneofs": {oneof.name: [f.name for f in oneof.fields] for oneof in message.oneofs},
        "map_entry": message.GetOptions().map_entry,
        "enums": {enum.name: _enum_shape(enum) for enum in message.enum_types},
        "nested": {nested.name: _message_shape(nested) for nested in message.nested_types},
    }


def test_every_message_and_field_matches_triton() -> None:
    ours, theirs = shoal_pb.DESCRIPTOR, triton_pb.DESCRIPTOR
    assert set(ours.message_types_by_name) == set(theirs.message_types_by_name)
    assert set(ours.enum_types_by_name) == set(theirs.enum_types_by_name) == set()
    for name, message in theirs.message_types_by_name.items():
        assert _message_shape(ours.message_types_by_name[name]) == _message_shape(message), name


def test_model_config_comes_from_shoals_own_proto() -> None:
    config = shoal_pb.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"]
    assert config.message_type.full_name == "shoal.inference.ModelConfig"


def test_every_rpc_uses_the_messages_of_the_same_name() -> None:
    (service,) = triton_pb.DESCRIPTOR.services_by_name.values()
    assert service.full_name == SERVICE_NAME
    for method in service.methods:
        expected_input = "ModelInferRequest" if method.name == "ModelStreamInfer" else None
        assert method.input_type.name == (expected_input or f"{method.name}Request")
        assert method.output_type.name == f"{method.name}Response"
        assert method.input_type.name in shoal_pb.DESCRIPTOR.message_types_by_name


def _everything() -> triton_pb.ModelInferRequest:
    request = triton_pb.ModelInferRequest(model_name="m", model_version="3", id="i")
    request.parameters["b"].bool_param = True
    request.parameters["i"].int64_param = -5
    request.parameters["s"].string_param = "text"
    request.parameters["d"].double_param = 0.25
    request.parameters["priority"].uint64_param = 2**40
    first = request.inputs.add(name="A", datatype="FP16", shape=[2, 1])
    first.parameters["note"].string_param = "x"
    request.inputs.add(name="B", datatype="BYTES", shape=[1])
    request.outputs.add(name="O").parameters["classification"].int64_param = 3
    request.raw_input_contents.extend([np.array([1, 2], np.float16).tobytes(), b"\2\0\0\0hi"])
    return request


def test_a_request_from_tritonclient_decodes_with_zero_copy_tensors() -> None:
    wire = _everything().SerializeToString()
    decoded = decode_infer_request(wire)
    request = decoded.request
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "i")
    assert request.parameters == {"b": True, "i": -5, "s": "text", "d": 0.25, "priority": 2**40}
    first, second = request.inputs
    assert (first.name, first.datatype, first.shape, first.parameters) == (
        "A",
        "FP16",
        (2, 1),
        {"note": "x"},
    )
    assert isinstance(first.data, memoryview) and first.data.readonly
    assert first.data.obj is wire  # a view of the received message: no copy
    assert bytes(second.data) == b"\2\0\0\0hi"
    assert [(o.name, o.parameters) for o in request.outputs] == [("O", {"classification": 3})]


def test_a_response_reads_back_with_tritonclients_messages() -> None:
    released: list[bool] = []
    response = InferResponse(
        "m",
        "3",
        "i",
        [
            InferOutput("A", "INT32", (2,), memoryview(np.array([7, 8], np.int32).tobytes())),
            InferOutput("S", "FP32", (1,), memoryview(b""), {"shared_memory_region": "r"}),
            InferOutput("E", "FP32", (0,), memoryview(b"")),
        ],
        {"big": 2**64 - 1, "neg": -1, "f": 1.5, "t": "x", "yes": True},
        _release=lambda: released.append(True),
    )
    decoded = DecodedInfer(decode_infer_request(b"").request, frozenset({"S"}), True)
    chunks = encode_infer_response(response, decoded, final=True)
    assert not released  # the caller releases once it has joined the chunks
    theirs = triton_pb.ModelInferResponse.FromString(b"".join(chunks))
    assert [o.name for o in theirs.outputs] == ["A", "S", "E"]
    assert list(theirs.raw_output_contents) == [np.array([7, 8], np.int32).tobytes(), b"", b""]
    assert theirs.outputs[1].parameters["shared_memory_region"].string_param == "r"
    params = json_format.MessageToDict(theirs, preserving_proto_field_name=True)["parameters"]
    assert params == {
        "big": {"uint64_param": str(2**64 - 1)},
        "neg": {"int64_param": "-1"},
        "f": {"double_param": 1.5},
        "t": {"string_param": "x"},
        "yes": {"bool_param": True},
        "triton_final_response": {"bool_param": True},
    }
    stream = triton_pb.ModelStreamInferResponse.FromString(b"".join(stream_response_chunks(chunks)))
    assert stream.error_message == "" and stream.infer_response == theirs


@pytest.mark.parametrize(
    ("shape", "parameters"),
    [((1, 16), {}), ((), {}), ((0, 3), {}), ((300, 2**40), {"p": 1}), ((-1, 5), {"s": "x"})],
    ids=["small", "scalar", "empty", "wide-dims", "negative-dim"],
)
@pytest.mark.parametrize("final", [None, False, True])  # None: ModelInfer, no stream flag
def test_a_response_is_what_protobuf_would_write(
    shape: tuple[int, ...], parameters: dict[str, Any], final: bool | None
) -> None:
    data = memoryview(bytes(8))
    outputs = [
        InferOutput("ÖUT", "BYTES", shape, data, parameters),
        InferOutput("B", "BYTES", (2,), data),
    ]
    response = InferResponse("módel", "", "req-1", outputs, {"n": 2} if final else {})
    decoded = DecodedInfer(decode_infer_request(b"").request, frozenset(), final_response_flag=True)
    expected = shoal_pb.ModelInferResponse(model_name="módel", id="req-1")
    if final:
        expected.parameters["n"].int64_param = 2
    if final is not None:
        expected.parameters["triton_final_response"].bool_param = final
    for output in outputs:
        tensor = expected.outputs.add(
            name=output.name, datatype=output.datatype, shape=output.shape
        )
        for key, value in output.parameters.items():
            if isinstance(value, str):
                tensor.parameters[key].string_param = value
            else:
                tensor.parameters[key].int64_param = value
        expected.raw_output_contents.append(bytes(8))
    wire = b"".join(encode_infer_response(response, decoded, final=final))
    assert wire == expected.SerializeToString()


def test_a_stream_error_names_the_request() -> None:
    request = decode_infer_request(_everything().SerializeToString()).request
    theirs = triton_pb.ModelStreamInferResponse.FromString(stream_error("boom", request))
    assert theirs.error_message == "boom"
    assert (theirs.infer_response.model_name, theirs.infer_response.id) == ("m", "i")


# --- the wire scanner -------------------------------------------------------------------------


def test_varints() -> None:
    assert [encode_varint(v) for v in (0, 1, 127, 128, 300)] == [
        b"\0",
        b"\1",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
    ]


def test_split_keeps_every_other_field_including_fixed_width_ones() -> None:
    request = _everything()
    # Unknown fields of every wire type protobuf may send: varint, fixed64, fixed32, bytes.
    extra = b"\xa0\x06\x05" + b"\xa9\x06" + bytes(8) + b"\xb5\x06" + bytes(4) + b"\xba\x06\x01z"
    wire = request.SerializeToString() + extra
    rest, raw = split_raw_contents(wire, 7)
    assert [bytes(entry) for entry in raw] == list(request.raw_input_contents)
    parsed = triton_pb.ModelInferRequest.FromString(rest)
    assert [field.field_number for field in UnknownFieldSet(parsed)] == [100, 101, 102, 103]
    parsed.DiscardUnknownFields()
    request.ClearField("raw_input_contents")
    assert parsed == request


def test_split_joins_the_fields_around_entries_written_out_of_order() -> None:
    head = shoal_pb.ModelInferRequest(model_name="m").SerializeToString()
    tail = shoal_pb.ModelInferRequest(id="i").SerializeToString()
    entry = b"\x3a\x02ab"
    rest, raw = split_raw_contents(head + entry + tail + entry, 7)
    assert [bytes(entry) for entry in raw] == [b"ab", b"ab"]
    assert bytes(rest) == head + tail


def test_a_message_of_more_fields_than_the_walk_takes_is_left_to_protobuf() -> None:
    request = triton_pb.ModelInferRequest(model_name="m")
    for index in range(MAX_WALKED_FIELDS):
        request.parameters[f"p{index}"].int64_param = index
    request.raw_input_contents.append(b"tensor")
    wire = request.SerializeToString()
    rest, raw = split_raw_contents(wire, 7)
    assert rest is wire and raw == []  # whole: protobuf parses the entries with the rest
    assert triton_pb.ModelInferRequest.FromString(rest).raw_input_contents == [b"tensor"]


def test_a_field_numbered_zero_is_refused_at_once() -> None:
    with pytest.raises(InvalidArgument, match="a field numbered 0"):
        split_raw_contents(bytes(1 << 20), 7)


def test_split_without_the_field_returns_the_message_itself() -> None:
    wire = triton_pb.ModelInferRequest(model_name="m").SerializeToString()
    rest, raw = split_raw_contents(wire, 7)
    assert rest is wire and raw == []


@pytest.mark.parametrize(
    ("wire", "detail"),
    [
        (b"\x3a\x05ab", "field 7 runs past the end"),
        (b"\x08", "a varint is cut off"),
        (b"\x08" + b"\xff" * 11, "a varint is cut off or too long"),
        (b"\x0b", "field 1 has the unsupported wire type 3"),
        (b"\x09\x00", "field 1 runs past the end"),
    ],
    ids=["length", "cut-varint", "long-varint", "group", "fixed64"],
)
def test_split_refuses_malformed_messages(wire: bytes, detail: str) -> None:
    with pytest.raises(InvalidArgument, match=detail):
        split_raw_contents(wire, 7)


# --- every RPC is served ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def channel(loop_thread: LoopThread) -> Iterator[grpc.Channel]:
    with serving(loop_thread, FullCore()) as url, grpc.insecure_channel(url) as opened:
        yield opened


def _call(channel: grpc.Channel, method: Any) -> Any:
    path = f"/{SERVICE_NAME}/{method.name}"
    request_bytes = b""  # the empty message of every request type
    response_type = triton_pb.DESCRIPTOR.message_types_by_name[method.output_type.name]
    parse = _message_class(response_type).FromString
    if method.client_streaming:
        call = channel.stream_stream(path, response_deserializer=parse)
        return list(call(iter([request_bytes]), timeout=10))
    return channel.unary_unary(path, response_deserializer=parse)(request_bytes, timeout=10)


def _message_class(descriptor: Descriptor) -> Any:
    return getattr(triton_pb, descriptor.name)


@pytest.mark.parametrize(
    "method",
    list(triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods),
    ids=lambda m: m.name,
)
def test_every_rpc_of_tritons_service_is_served(channel: grpc.Channel, method: Any) -> None:
    try:
        _call(channel, method)
    except grpc.RpcError as error:
        # An answer from our handler (an empty request is often an error), not from gRPC's
        # "no such method".
        assert error.details() != "Method not found!", method.name
        assert error.code() in (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.UNAVAILABLE,
        ), (method.name, error.code(), error.details())
