"""A plain ``ModelInferRequest`` read field by field, without a protobuf message.

Parsing the request's fields (its raw contents cut out already, see
:mod:`~shoal.frontends.grpc._wire`) into a protobuf message and reading them back through the
Python API costs a third of a frontend worker's CPU for a small ModelInfer: a wrapper object
per message, container and attribute read. A plain request (strings, inputs with a name, a
datatype and a shape, requested outputs with a name: no parameters, no typed contents, no
other field) is read here instead, in one walk of its bytes. Whatever is not plain, or not
well formed, gives None, and the caller parses the message with protobuf as before: protobuf
stays the judge of malformed messages and says what is wrong with them.

A small message (:data:`PLAIN_MAX_BYTES` at most, raw contents and all: a small ModelInfer) is
read whole by :func:`read_plain_message`, its raw contents cut out in the same walk: one walk of
one ``bytes`` copy, not the walk of :func:`~shoal.frontends.grpc._wire.split_raw_contents` over
a ``memoryview`` (a generic look-up per byte read) and then this one over the rest.

A client sends the same fields request after request; only the raw contents change.
:func:`split_fields` cuts a small message into its other fields' bytes and its raw entries in
one walk of its top-level fields; :func:`known_shape` gives what the decode made of those same
fields lately (a :class:`PlainShape`: checked already), so a repeat is neither walked field by
field nor checked again. Its raw entries, which differ per request, are checked every time.
"""

from __future__ import annotations

from typing import Final

#: A request whose fields (its raw contents cut out) take more bytes is left to protobuf.
PLAIN_MAX_BYTES: Final = 4096

# Wire types, and the field numbers of ModelInferRequest and of its tensors. Each Final, one
# per line: compiled, a Final literal is inlined, where a plain global (or one assigned by
# unpacking a tuple) is a look-up in the module's dict, ~140 instructions, at every use (46
# per small request in this module and _wire before they were made Final).
_VARINT: Final = 0
_LENGTH_DELIMITED: Final = 2
_MODEL_NAME: Final = 1
_MODEL_VERSION: Final = 2
_ID: Final = 3
_INPUTS: Final = 5
_OUTPUTS: Final = 6
_RAW_INPUT_CONTENTS: Final = 7
_TENSOR_NAME: Final = 1
_TENSOR_DATATYPE: Final = 2
_TENSOR_SHAPE: Final = 3
_INT64_SIGN: Final = 1 << 63
_UINT64_LIMIT: Final = 1 << 64
#: Fields of up to this many bytes are remembered by :func:`remember_shape`, up to this many at
#: once: at most 512 KiB of keys per process; a client that never repeats itself empties it now
#: and then.
_KEPT_FIELDS: Final = 2048
_KEPT_SHAPES: Final = 256
#: The builtin, read once (compiled, its name is a look-up on the ``builtins`` module per use).
_memoryview: Final = memoryview


class PlainInput:
    """An input of a plain request: its name, datatype and shape, as the message has them."""

    __slots__ = ("datatype", "name", "shape")

    def __init__(self) -> None:
        self.name = ""
        self.datatype = ""
        self.shape: list[int] = []


class PlainRequest:
    """The fields of a plain request."""

    __slots__ = ("id", "inputs", "model_name", "model_version", "outputs")

    def __init__(self) -> None:
        self.model_name = ""
        self.model_version = ""
        self.id = ""
        self.inputs: list[PlainInput] = []
        self.outputs: list[str] = []


class CheckedInput:
    """An input of a :class:`PlainShape`: its name, datatype and shape, checked by the decode."""

    __slots__ = ("datatype", "name", "shape")

    def __init__(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape


class PlainShape:
    """What the decode made of a plain request's fields (all but its raw contents), checked:
    what each request with the same fields is made of anew. Never written once made (a
    remembered one serves many requests); its shapes are tuples and its lists only read."""

    __slots__ = ("id", "inputs", "model_name", "model_version", "outputs")

    def __init__(self, request: PlainRequest, inputs: list[CheckedInput]) -> None:
        self.model_name = request.model_name
        self.model_version = request.model_version
        self.id = request.id
        self.inputs = inputs
        self.outputs = request.outputs


_SHAPES: Final[dict[bytes, PlainShape]] = {}


class _NotPlain(Exception):
    """The request is not plain, or not well formed: protobuf reads it."""


def read_plain(header: bytes | bytearray | memoryview) -> PlainRequest | None:
    """The fields of ``header`` (a serialized ModelInferRequest without raw contents) if the
    request is plain; else None."""
    if len(header) > PLAIN_MAX_BYTES:
        return None
    data = bytes(header)
    try:
        return _request(data, None, [])
    except (_NotPlain, UnicodeDecodeError):
        return None


def read_plain_message(
    message: bytes | bytearray | memoryview,
) -> tuple[PlainRequest, list[memoryview]] | None:
    """The fields of a whole serialized ModelInferRequest of at most :data:`PLAIN_MAX_BYTES`
    if it is plain, and its ``raw_input_contents`` entries, in order, as read-only views of
    ``message`` (as :func:`~shoal.frontends.grpc._wire.split_raw_contents` cuts them); else
    None: the caller splits the message and reads it as before."""
    if len(message) > PLAIN_MAX_BYTES:
        return None
    view = _memoryview(message)
    if not isinstance(message, bytes):  # a view of a bytes object is read-only already
        view = view.toreadonly()
    entries: list[memoryview] = []
    try:
        request = _request(bytes(message), view, entries)
    except (_NotPlain, UnicodeDecodeError):
        return None
    return request, entries


def split_fields(
    message: bytes | bytearray | memoryview,
) -> tuple[bytes, list[memoryview]] | None:
    """A message of at most :data:`PLAIN_MAX_BYTES` whose raw contents come after all its other
    fields (as serializers write them, in field-number order): those fields' bytes, and the
    ``raw_input_contents`` entries, in order, as read-only views of ``message`` (as
    :func:`read_plain_message` cuts them). None for any other (too long, not walkable, raw
    contents between other fields): :func:`read_plain_message` reads it."""
    if len(message) > PLAIN_MAX_BYTES:
        return None
    data = message if isinstance(message, bytes) else bytes(message)
    view = _memoryview(message)
    if not isinstance(message, bytes):  # a view of a bytes object is read-only already
        view = view.toreadonly()
    entries: list[memoryview] = []
    offset, end = 0, len(data)
    fields = -1  # where the raw contents begin
    try:
        while offset < end:
            field, start, stop = _delimited(data, offset, end)
            if field == _RAW_INPUT_CONTENTS:
                if fields < 0:
                    fields = offset
                entries.append(view[start:stop])
            elif fields >= 0:
                return None  # a field after raw contents: the others are not one run
            offset = stop
    except _NotPlain:
        return None
    return (data if fields < 0 else data[:fields]), entries


def known_shape(fields: bytes) -> PlainShape | None:
    """The shape of a request whose fields (see :func:`split_fields`) were ``fields`` lately."""
    return _SHAPES.get(fields)


def remember_shape(fields: bytes, shape: PlainShape) -> None:
    """Keep ``shape``, made of the request fields ``fields`` without error, for
    :func:`known_shape` (short fields only: the keys are bounded)."""
    if len(fields) > _KEPT_FIELDS:
        return
    if len(_SHAPES) >= _KEPT_SHAPES:
        _SHAPES.clear()  # cheaper than an order of use, and a steady client refills it at once
    _SHAPES[fields] = shape


def _request(data: bytes, view: memoryview | None, entries: list[memoryview]) -> PlainRequest:
    """The fields of ``data``; the entries of raw contents, views of ``view`` (a view of the
    same bytes), appended to ``entries``. Without ``view`` raw contents are not plain."""
    request = PlainRequest()
    offset, end = 0, len(data)
    while offset < end:
        field, start, stop = _delimited(data, offset, end)
        if field == _MODEL_NAME:
            request.model_name = data[start:stop].decode("utf-8")
        elif field == _MODEL_VERSION:
            request.model_version = data[start:stop].decode("utf-8")
        elif field == _ID:
            request.id = data[start:stop].decode("utf-8")
        elif field == _INPUTS:
            request.inputs.append(_input(data, start, stop))
        elif field == _OUTPUTS:
            request.outputs.append(_output(data, start, stop))
        elif field == _RAW_INPUT_CONTENTS and view is not None:
            entries.append(view[start:stop])
        else:  # parameters, raw contents left in (a message too long to walk), unknown ones
            raise _NotPlain
        offset = stop
    return request


def _input(data: bytes, offset: int, end: int) -> PlainInput:
    tensor = PlainInput()
    while offset < end:
        key, offset = _varint(data, offset, end)
        if key == _TENSOR_SHAPE << 3 | _VARINT:  # one dimension, unpacked
            dim, offset = _varint(data, offset, end)
            tensor.shape.append(_signed(dim))
            continue
        field, start, offset = _value(data, key, offset, end)
        if field == _TENSOR_NAME:
            tensor.name = data[start:offset].decode("utf-8")
        elif field == _TENSOR_DATATYPE:
            tensor.datatype = data[start:offset].decode("utf-8")
        elif field == _TENSOR_SHAPE:  # packed
            while start < offset:
                dim, start = _varint(data, start, offset)
                tensor.shape.append(_signed(dim))
        else:  # parameters, typed contents, unknown fields
            raise _NotPlain
    return tensor


def _output(data: bytes, offset: int, end: int) -> str:
    name = ""
    while offset < end:
        field, start, offset = _delimited(data, offset, end)
        if field != _TENSOR_NAME:  # parameters, unknown fields
            raise _NotPlain
        name = data[start:offset].decode("utf-8")
    return name


def _delimited(data: bytes, offset: int, end: int) -> tuple[int, int, int]:
    """(field number, start, end) of the length-delimited field whose tag is at ``offset``."""
    key, offset = _varint(data, offset, end)
    return _value(data, key, offset, end)


def _value(data: bytes, key: int, offset: int, end: int) -> tuple[int, int, int]:
    """(field number, start, end) of a length-delimited value whose length is at ``offset``."""
    if key & 7 != _LENGTH_DELIMITED:
        raise _NotPlain
    size, offset = _varint(data, offset, end)
    stop = offset + size
    if stop > end:
        raise _NotPlain
    return key >> 3, offset, stop


def _varint(data: bytes, offset: int, end: int) -> tuple[int, int]:
    """The varint at ``offset`` and the offset after it; one byte inline (the usual case)."""
    if offset < end:
        byte = data[offset]
        if byte < 0x80:
            return byte, offset + 1
    value = shift = 0
    while offset < end and shift < 70:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >= _UINT64_LIMIT:
                raise _NotPlain
            return value, offset
        shift += 7
    raise _NotPlain  # cut off, or longer than ten bytes


def _signed(value: int) -> int:
    """An int64 from its varint (a negative one is ten bytes, two's complement)."""
    return value - _UINT64_LIMIT if value >= _INT64_SIGN else value
