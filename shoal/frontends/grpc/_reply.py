"""A plain ``ModelInferResponse`` written field by field, without a protobuf message.

Building the reply as a protobuf message costs a message, a repeated container and an output
message per output, each field set through the Python API, then a serialization: about a tenth
of a frontend worker's CPU for a small ModelInfer. A reply with no parameters (the response's
and its outputs', the usual case) has only strings, a packed shape per output and the raw
contents, so it is written here straight into bytes, in the order protobuf writes them (field
numbers ascending), and parses to the same message. Anything else (parameters, a dimension
outside int64, a string that is not valid UTF-8) is left to protobuf: :func:`plain_reply`
returns None.
"""

from __future__ import annotations

from shoal.core import InferResponse
from shoal.frontends._output_bytes import output_bytes
from shoal.frontends.grpc._wire import Chunk, encode_varint, field_header, raw_field_chunks

# The field numbers of ModelInferResponse and of its InferOutputTensor (grpc_service.proto).
_MODEL_NAME, _MODEL_VERSION, _ID, _OUTPUTS, _RAW_OUTPUT_CONTENTS = 1, 2, 3, 5, 6
_TENSOR_NAME, _TENSOR_DATATYPE, _TENSOR_SHAPE = 1, 2, 3
_INT64_LIMIT = 1 << 63
_NO_DATA = memoryview(b"")


def plain_reply(response: InferResponse, in_shm: frozenset[str]) -> list[Chunk] | None:
    """The serialized reply to ``response`` as chunks (its outputs' bytes as views, in
    ``raw_output_contents``; an output in shared memory gets an empty entry), or None when
    it is not plain (see the module)."""
    if response.parameters:
        return None
    try:
        head = bytearray()
        _string(head, _MODEL_NAME, response.model_name)
        _string(head, _MODEL_VERSION, response.model_version)
        _string(head, _ID, response.id)
        payloads: list[memoryview] = []
        for output in response.outputs:
            if output.parameters:
                return None
            tensor = _tensor(output.name, output.datatype, output.shape)
            if tensor is None:
                return None
            head += field_header(_OUTPUTS, len(tensor))
            head += tensor
            payloads.append(_NO_DATA if output.name in in_shm else output_bytes(output))
    except UnicodeEncodeError:
        return None
    return [bytes(head), *raw_field_chunks(_RAW_OUTPUT_CONTENTS, payloads)]


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> bytearray | None:
    """An ``InferOutputTensor`` with no parameters; None for a dimension outside int64."""
    out = bytearray()
    _string(out, _TENSOR_NAME, name)
    _string(out, _TENSOR_DATATYPE, datatype)
    if shape:
        packed = bytearray()
        for dim in shape:
            if not 0 <= dim < _INT64_LIMIT:  # negative ones take ten bytes: left to protobuf
                return None
            packed += encode_varint(dim)
        out += field_header(_TENSOR_SHAPE, len(packed))
        out += packed
    return out


def _string(out: bytearray, number: int, value: str) -> None:
    """A string field; proto3 leaves an empty one out."""
    if value:
        data = value.encode("utf-8")
        out += field_header(number, len(data))
        out += data
