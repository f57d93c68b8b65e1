"""A plain ``ModelInferResponse`` written from cached encoded pieces, without a protobuf message.

Building the reply as a protobuf message costs a message, a repeated container and an output
message per output, each field set through the Python API, then a serialization: about a tenth
of a frontend worker's CPU for a small ModelInfer. A reply with no parameters (the response's
and its outputs', the usual case) has only strings, a packed shape per output and the raw
contents, so it is written here straight into bytes, in the order protobuf writes them (field
numbers ascending), and parses to the same message. Anything else (parameters, a dimension
outside int64, a string that is not valid UTF-8) is left to protobuf: :func:`plain_reply`
returns None.

The model's name and version, and each output's name, datatype and shape, repeat from call to
call: their encoded fields are kept (:class:`_Encoded`, keyed by their values, so an output
whose shape or datatype changes gets its own entry), and a reply is a lookup per output and one
join rather than a field header and an append per string and dimension. The tables are cleared
when full, so that a client sending ever new shapes or names cannot grow them.
"""

from __future__ import annotations

from typing import Final

from shoal.core import InferResponse
from shoal.frontends._output_bytes import output_bytes
from shoal.frontends.grpc._wire import JOIN_BELOW, Chunk, encode_varint, field_header

# The field numbers of ModelInferResponse and of its InferOutputTensor (grpc_service.proto);
# Final, one per line, so that compiled code inlines them (no look-up in the module's dict).
_MODEL_NAME: Final = 1
_MODEL_VERSION: Final = 2
_ID: Final = 3
_OUTPUTS: Final = 5
_RAW_OUTPUT_CONTENTS: Final = 6
_TENSOR_NAME: Final = 1
_TENSOR_DATATYPE: Final = 2
_TENSOR_SHAPE: Final = 3
_INT64_LIMIT: Final = 1 << 63
_NO_DATA: Final = memoryview(b"")
#: Entries of each table before it is cleared (heads per model version, fields per layout).
CACHE_LIMIT: Final = 1024
#: What is cached for pieces that are not plain (the reply is left to protobuf): never encoded
#: fields' bytes, which are empty or begin with a tag (0xFF is no tag of these messages).
_NOT_PLAIN: Final = b"\xff"
#: Positions of a reply whose last output field is kept apart (see _Encoded.output_at).
_LAST_OUTPUTS: Final = 16
#: The header of each ``raw_output_contents`` entry of fewer than 128 bytes: tag and length.
_SMALL_RAW_HEADERS: Final = [field_header(_RAW_OUTPUT_CONTENTS, size) for size in range(0x80)]


class _Encoded:
    """The encoded pieces of replies seen: the model name and version fields per (name,
    version), the ``outputs`` field per (name, datatype, shape); ``_NOT_PLAIN`` for one whose
    strings are not valid UTF-8 or whose shape has a dimension outside int64. The last head
    is kept apart too, compared field by field: replies of one model follow each other, and
    two string compares cost less than a key made, hashed and looked up (~1,000 instructions;
    each piece is a function of its key, so the last one is always right for its key), and so
    is the last output field at each position of a reply."""

    def __init__(self) -> None:
        self.heads: dict[tuple[str, str], bytes] = {}
        self.outputs: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
        self._last_name = self._last_version = ""
        self._last_head = b""
        #: The last output field at each position of a reply, as the last head (one model's
        #: replies follow each other, their outputs in the same order).
        self._last_outputs: list[_LastOutput] = []

    def head(self, model_name: str, model_version: str) -> bytes:
        if model_name == self._last_name and model_version == self._last_version:
            return self._last_head
        head = self._head(model_name, model_version)
        self._last_name, self._last_version, self._last_head = model_name, model_version, head
        return head

    def _head(self, model_name: str, model_version: str) -> bytes:
        key = (model_name, model_version)
        head = self.heads.get(key)
        if head is None:
            head = _head(model_name, model_version)
            if len(self.heads) >= CACHE_LIMIT:
                self.heads.clear()
            self.heads[key] = head
        return head

    def output_at(self, index: int, name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
        """The ``outputs`` field of the output at ``index`` of a reply."""
        lasts = self._last_outputs
        if index < len(lasts):
            last = lasts[index]
            if last.name == name and last.datatype == datatype and last.shape == shape:
                return last.field
        field = self.output(name, datatype, shape)
        if index < len(lasts):
            lasts[index] = _LastOutput(name, datatype, shape, field)
        elif index == len(lasts) and index < _LAST_OUTPUTS:
            lasts.append(_LastOutput(name, datatype, shape, field))
        return field

    def output(self, name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
        key = (name, datatype, shape)
        field = self.outputs.get(key)
        if field is None:
            field = _output_field(name, datatype, shape)
            if len(self.outputs) >= CACHE_LIMIT:
                self.outputs.clear()
            self.outputs[key] = field
        return field


class _LastOutput:
    """An output's encoded field with the values it encodes."""

    __slots__ = ("datatype", "field", "name", "shape")

    def __init__(self, name: str, datatype: str, shape: tuple[int, ...], field: bytes) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.field = field


_ENCODED: Final = _Encoded()


def plain_reply(response: InferResponse, in_shm: frozenset[str]) -> list[Chunk] | None:
    """The serialized reply to ``response`` as chunks (its outputs' bytes as views, in
    ``raw_output_contents``; an output in shared memory gets an empty entry), or None when
    it is not plain (see the module). A reply whose outputs are all smaller than
    :data:`~shoal.frontends.grpc._wire.JOIN_BELOW` is one chunk, joined here: every caller
    joins such a reply (none is lent: ``infer_call.LEND_FROM``), and one join of one list
    costs less than a list of chunks walked, then joined."""
    if response.parameters:
        return None
    encoded = _ENCODED
    head = encoded.head(response.model_name, response.model_version)
    if head == _NOT_PLAIN:
        return None
    parts: list[Chunk] = [head]
    if response.id:
        try:
            parts.append(_string(_ID, response.id))
        except UnicodeEncodeError:
            return None
    raw: list[Chunk] = []
    small = True
    for index, output in enumerate(response.outputs):
        if output.parameters:
            return None
        field = encoded.output_at(index, output.name, output.datatype, output.shape)
        if field == _NOT_PLAIN:
            return None
        parts.append(field)
        payload = _NO_DATA if output.name in in_shm else output_bytes(output)
        size = payload.nbytes
        raw.append(
            _SMALL_RAW_HEADERS[size] if size < 0x80 else field_header(_RAW_OUTPUT_CONTENTS, size)
        )
        if size:
            raw.append(payload)
            small = small and size < JOIN_BELOW
    if small:
        parts += raw
        return [b"".join(parts)]
    return [b"".join(parts), *raw]


def _head(model_name: str, model_version: str) -> bytes:
    """The model name and version fields; ``_NOT_PLAIN`` if either is not valid UTF-8."""
    try:
        return _string(_MODEL_NAME, model_name) + _string(_MODEL_VERSION, model_version)
    except UnicodeEncodeError:
        return _NOT_PLAIN


def _output_field(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    """The ``outputs`` field of an ``InferOutputTensor`` with no parameters; ``_NOT_PLAIN`` for
    a dimension outside int64 or a string that is not valid UTF-8."""
    try:
        tensor = _string(_TENSOR_NAME, name) + _string(_TENSOR_DATATYPE, datatype)
    except UnicodeEncodeError:
        return _NOT_PLAIN
    if shape:
        packed = bytearray()
        for dim in shape:
            if not 0 <= dim < _INT64_LIMIT:  # negative ones take ten bytes: left to protobuf
                return _NOT_PLAIN
            packed += encode_varint(dim)
        tensor += field_header(_TENSOR_SHAPE, len(packed)) + bytes(packed)
    return field_header(_OUTPUTS, len(tensor)) + tensor


def _string(number: int, value: str) -> bytes:
    """A string field; proto3 leaves an empty one out."""
    if not value:
        return b""
    data = value.encode("utf-8")
    return field_header(number, len(data)) + data
