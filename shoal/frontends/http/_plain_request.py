"""A plain infer request's JSON read in one short walk, without the general document walk.

Most clients (tritonclient, perf_analyzer) send the same small shapes of JSON: inputs with a
name, a datatype, a shape and either ``parameters.binary_data_size`` or ``data``; outputs with a
name and perhaps ``parameters.binary_data``; perhaps an ``id`` and the request's
``binary_data_output``. For those, the general walk (:mod:`._request`) spends more on checking
fields that are not there (each parameter's type, the one-source rule, generators) than on the
request itself. :func:`read_plain` reads a document of exactly those shapes; any other field,
type or value gives None, and the caller walks the document the general way, which also says
what is wrong with a malformed one. The checks that may fail here (binary sizes, JSON data) are
the general walk's own functions, called in the same order, so both ways answer alike.

:func:`parse_small` parses a small JSON header at once where no depth check is needed.

A client sends the same header bytes for request after request (the same model, shapes and
outputs; only the binary data after the header changes). What a plain header says apart from the
data is a :class:`PlainShape`; :func:`known_shape` keeps the shapes of recent all-binary headers by
their bytes, so a repeated header is neither parsed nor walked again (~16k instructions of the
~140k a served request costs a worker). The checks that depend on the body (binary sizes) run
for every request.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.core import DATATYPES, InferInput, ParamValue, RequestedOutput
from shoal.frontends._binary import BinarySection, check_binary_input
from shoal.frontends.http import _json
from shoal.frontends.http._tensor_json import array_from_json

#: A JSON header longer than this is parsed the general way (:func:`_json.loads`).
SMALL_DOCUMENT: Final = 4096
#: Shorter than this, a JSON document cannot nest past the depth limit: each level is an
#: opening and a closing bracket (:func:`parse_small`).
_SHORT: Final = 2 * (_json.MAX_DEPTH + 1)

_DATATYPES: Final = frozenset(DATATYPES)
_BINARY_SIZE: Final = "binary_data_size"
_INT_END: Final = 1 << 64  # as _params: a parameter holds at most a uint64
#: Headers up to this long are remembered by :func:`remember_shape`, up to this many at once: at
#: most 512 KiB of keys per process; a client that never repeats itself empties it now and then.
_KEPT_HEADER: Final = 2048
_KEPT_SHAPES: Final = 256
_SHAPES: Final[dict[bytes, PlainShape]] = {}


class PlainRequest:
    """What a plain document says, the inputs' data already taken from the body."""

    __slots__ = ("binary", "binary_default", "id", "inputs", "outputs")

    def __init__(self, request_id: str, binary_default: bool, binary: dict[str, bool]) -> None:
        self.id = request_id
        self.binary_default = binary_default
        self.inputs: list[InferInput] = []
        self.outputs: list[RequestedOutput] = []
        #: Each output's own ``binary_data``, where given (its shape's: read only).
        self.binary = binary


class PlainShape:
    """What a plain header says, apart from the data: the request made anew from it for each
    body. Never written once made (a remembered one serves many requests)."""

    __slots__ = ("binary", "binary_default", "id", "inputs", "outputs")

    def __init__(self, request_id: str, binary_default: bool) -> None:
        self.id = request_id
        self.binary_default = binary_default
        self.inputs: list[_Input] = []
        self.outputs: list[str] = []
        #: Each output's own ``binary_data``, where given (shared by the requests made).
        self.binary: dict[str, bool] = {}


class _Input:
    """A plain input's fields, before its data is read."""

    __slots__ = ("data", "datatype", "name", "shape", "size")

    def __init__(self, name: str, datatype: str, shape: tuple[int, ...], size: int, data: Any):
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.size = size  # binary_data_size; -1 for JSON data
        self.data = data


def parse_small(header: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """The JSON object of a small header whose brackets cannot nest past the depth limit, or
    None (too large, more openings than the limit, not an object, not orjson's JSON):
    :func:`_json.loads` decides."""
    loads = _json.ORJSON_LOADS
    if loads is None or len(header) > SMALL_DOCUMENT:
        return None
    data = header if isinstance(header, bytes) else bytes(header)
    # No deeper than its openings, counted inside strings too: at most too careful. A header
    # shorter than twice the limit needs no count (~1.3k instructions each): a document orjson
    # accepts closes each of its openings, so it has fewer than the limit; one it refuses goes
    # to _json.loads anyway.
    if len(data) >= _SHORT and data.count(b"[") + data.count(b"{") > _json.MAX_DEPTH:
        return None
    try:
        document = loads(data)
    except ValueError:
        return None
    return document if type(document) is dict else None


def read_plain(document: dict[str, Any], binary: BinarySection) -> PlainRequest | None:
    """The request ``document`` describes if it is plain, its binary inputs taken from
    ``binary`` (a fresh section); None if it is not plain, having taken nothing from
    ``binary`` (the general walk reads it next). Raises what the general walk would
    raise for a plain document (a binary size or JSON data that does not fit)."""
    shape = plain_shape(document)
    return None if shape is None else read_shape(shape, binary)


def plain_shape(document: dict[str, Any]) -> PlainShape | None:
    """What ``document`` says if it is plain; None if it is not."""
    known = ("inputs" in document) + ("outputs" in document)
    if len(document) != known + ("id" in document) + ("parameters" in document):
        return None  # another field (look-ups: a set comparison of the keys costs more)
    shape = _plain_head(document)
    inputs = _plain_inputs(document.get("inputs"))
    if shape is None or inputs is None or not _plain_outputs(document, shape):
        return None
    shape.inputs = inputs
    return shape


def read_shape(shape: PlainShape, binary: BinarySection) -> PlainRequest:
    """The request ``shape`` describes, its binary inputs taken from ``binary``."""
    request = PlainRequest(shape.id, shape.binary_default, shape.binary)
    inputs = request.inputs
    for entry in shape.inputs:  # checked in the general walk's order: input by input, then the rest
        data: Any
        if entry.size >= 0:
            data = binary.take(entry.name, entry.size)
            check_binary_input(entry.name, entry.datatype, entry.shape, data, binary.model_name)
        else:
            data = array_from_json(entry.name, entry.datatype, entry.shape, entry.data)
        inputs.append(InferInput(entry.name, entry.datatype, entry.shape, data, {}))
    binary.finish()
    outputs = request.outputs
    for name in shape.outputs:
        no_parameters: dict[str, ParamValue] = {}
        outputs.append(RequestedOutput(name, no_parameters))
    return request


def known_shape(header: bytes) -> PlainShape | None:
    """The shape of ``header`` if it was seen lately (see :func:`remember_shape`)."""
    return _SHAPES.get(header)


def remember_shape(header: bytes, shape: PlainShape) -> None:
    """Keep the shape of a short all-binary ``header`` for :func:`known_shape`. JSON data is
    left out: it is converted (and a long list emptied) for each request."""
    if len(header) > _KEPT_HEADER or any(entry.size < 0 for entry in shape.inputs):
        return
    if len(_SHAPES) >= _KEPT_SHAPES:
        _SHAPES.clear()  # cheaper than an order of use, and a steady client refills it at once
    _SHAPES[header] = shape


def _plain_head(document: dict[str, Any]) -> PlainShape | None:
    """The request's id and ``binary_data_output``, if those are all it sets."""
    request_id = document.get("id", "")
    parameters = document.get("parameters")
    binary_default = False
    if parameters is not None:
        if type(parameters) is not dict or len(parameters) > 1:
            return None
        if parameters:
            # Read into an untyped name first: compiled, assigning a value of another type to
            # the bool ``binary_default`` raises TypeError before the check below can refuse it.
            value: Any = parameters.get("binary_data_output")
            if type(value) is not bool:
                return None
            binary_default = value
    if type(request_id) is not str:
        return None
    return PlainShape(request_id, binary_default)


def _plain_inputs(entries: Any) -> list[_Input] | None:
    if type(entries) is not list:
        return None
    inputs: list[_Input] = []
    names: set[str] = set()
    for entry in entries:
        tensor = _plain_input(entry)
        if tensor is None or tensor.name in names:
            return None  # a repeated name: the general walk says which
        names.add(tensor.name)
        inputs.append(tensor)
    return inputs


def _plain_input(entry: Any) -> _Input | None:
    if type(entry) is not dict:
        return None
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    if type(name) is not str or not name or type(datatype) is not str:
        return None
    if datatype not in _DATATYPES or type(shape) is not list:
        return None
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return None
    if len(entry) != 4:  # name, datatype, shape (all found) and one more
        return None
    if "data" in entry:
        return _Input(name, datatype, tuple(shape), -1, entry["data"])
    parameters = entry.get("parameters")
    if type(parameters) is not dict or len(parameters) != 1:
        return None
    size = parameters.get(_BINARY_SIZE)
    if type(size) is not int or not 0 <= size < _INT_END:
        return None
    return _Input(name, datatype, tuple(shape), size, None)


def _plain_outputs(document: dict[str, Any], shape: PlainShape) -> bool:
    """Add the requested outputs to ``shape`` if each has a name and at most its own
    ``binary_data``; False if one has more."""
    entries = document.get("outputs", [])
    if type(entries) is not list:
        return False
    for entry in entries:
        if type(entry) is not dict:
            return False
        name = entry.get("name")
        if type(name) is not str or not name:
            return False
        if len(entry) == 2:
            wants_binary = _binary_flag(entry.get("parameters"))
            if wants_binary is None:
                return False
            shape.binary[name] = wants_binary
        elif len(entry) != 1:
            return False
        shape.outputs.append(name)
    return True


def _binary_flag(parameters: Any) -> bool | None:
    """An output's ``binary_data`` if its parameters hold only that."""
    if type(parameters) is not dict or len(parameters) != 1:
        return None
    flag = parameters.get("binary_data")
    return flag if type(flag) is bool else None
