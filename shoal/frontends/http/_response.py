"""Encode an :class:`InferResponse` as a V2 infer response body.

JSON outputs carry ``data`` as a flat row-major list. Binary outputs (binary tensor data
extension) carry ``parameters.binary_data_size`` and their bytes follow the JSON header, in output
order; the ``Inference-Header-Content-Length`` header gives the JSON header's size. Outputs the
client placed in shared memory (requested with, or returned with, ``shared_memory_region`` in their
parameters) carry neither, nor the ``shared_memory_*`` parameters, as Triton. The body is
returned as chunks (header bytes, then the outputs' own memoryviews) so that the caller copies
the tensor bytes exactly once, when it joins them. A JSON body with large arrays is returned as
pieces (:func:`_json.dumps_around`), sent as they are: no call copies the whole body at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from shoal.core import InferOutput, InferResponse
from shoal.frontends._output_bytes import output_bytes
from shoal.frontends.http import _json
from shoal.frontends.http._request import OutputFormat
from shoal.frontends.http._tensor_json import json_from_output, json_pieces_from_output

JSON_CONTENT_TYPE: Final = "application/json"
BINARY_CONTENT_TYPE: Final = "application/octet-stream"
HEADER_LENGTH: Final = "inference-header-content-length"
_SHM_REGION: Final = "shared_memory_region"
_SHM_PREFIX: Final = "shared_memory_"

#: Binary bodies this large or larger are lent (:class:`LentBody`) where the caller can send
#: them so; below it the copy costs less than holding the memory until the bytes are sent.
LEND_MIN: Final = 1 << 18


class LentBody:
    """A binary body whose pieces view the response's shared memory, with the release that
    gives it back: sent as it is, then released (no copy of the tensor bytes)."""

    def __init__(self, pieces: tuple[bytes | memoryview, ...], release: Callable[[], None]):
        self.pieces = pieces
        self.release = release

    def joined(self) -> bytes:
        """The whole body, copied; the memory is released."""
        try:
            return b"".join(self.pieces)
        finally:
            self.release()


#: A response body: whole, in pieces to send one after the other (a large JSON body), or lent.
Body = bytes | tuple[bytes | memoryview, ...] | LentBody


@dataclass
class EncodedResponse:
    """HTTP headers and body chunks of an infer response.

    The chunks may view the response's shared memory: join them (:meth:`body`) before releasing it.
    """

    headers: Final[tuple[tuple[str, str], ...]]
    chunks: Final[tuple[bytes | memoryview, ...]]
    #: The chunks are the response's own (JSON pieces), not views of its shared memory.
    owned: Final[bool]

    def __init__(
        self,
        headers: tuple[tuple[str, str], ...],
        chunks: tuple[bytes | memoryview, ...],
        owned: bool = False,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.headers = headers
        self.chunks = chunks
        self.owned = owned

    def body(self) -> bytes:
        """The whole body, in one copy."""
        return b"".join(self.chunks)

    def lendable(self) -> bool:
        """Whether the body may be lent (:class:`LentBody`): views, :data:`LEND_MIN` or more."""
        return not self.owned and body_length(self.chunks) >= LEND_MIN

    def payload(self) -> Body:
        """The body to send: owned pieces as they are, anything else joined (:meth:`body`)."""
        return self.chunks if self.owned else self.body()


#: A JSON response's headers: one tuple, whose encoded lines the HTTP protocol keeps.
_JSON_HEADERS: Final = (("content-type", JSON_CONTENT_TYPE),)
#: The HTTP headers and JSON header of a binary response, by its layout (:func:`_layout`): the
#: same for every response of a model whose outputs keep their shapes, so encoded once.
_BINARY_HEADS: Final[dict[tuple[Any, ...], tuple[tuple[tuple[str, str], ...], bytes]]] = {}
#: Layouts kept at most (a model with outputs of many shapes): past it, the cache starts over.
BINARY_HEADS_MAX: Final = 512


def encode_infer_response(response: InferResponse, output_format: OutputFormat) -> EncodedResponse:
    """Render ``response`` with each output binary or JSON as ``output_format`` says."""
    data: list[memoryview] = []
    layout = _layout(response, output_format, data)
    if layout is None:
        return _encode(response, output_format)
    head = _BINARY_HEADS.get(layout)
    if head is None:
        encoded = _encode(response, output_format)
        if len(_BINARY_HEADS) >= BINARY_HEADS_MAX:
            _BINARY_HEADS.clear()
        _BINARY_HEADS[layout] = encoded.headers, bytes(encoded.chunks[0])
        return encoded
    return EncodedResponse(head[0], (head[1], *data))


def _layout(
    response: InferResponse, output_format: OutputFormat, data: list[memoryview]
) -> tuple[Any, ...] | None:
    """What a binary response's headers depend on: the model, its version and each output's
    name, datatype, shape and size; None for a response that is not all binary outputs without
    an id or parameters. The outputs' bytes (those not empty) go to ``data``."""
    if response.id or response.parameters or output_format.shared_memory:
        return None
    layout: list[Any] = [response.model_name, response.model_version]
    for output in response.outputs:
        if output.parameters or not output_format.is_binary(output.name):
            return None
        view = output_bytes(output)
        nbytes = view.nbytes  # read once: a generic attribute look-up, compiled
        layout += [output.name, output.datatype, tuple(output.shape), nbytes]
        if nbytes:
            data.append(view)
    return tuple(layout)


def _encode(response: InferResponse, output_format: OutputFormat) -> EncodedResponse:
    """:func:`encode_infer_response`, every output encoded as it comes."""
    document = _document(response)
    outputs: list[dict[str, Any]] = []
    binary: list[memoryview] = []
    arrays: list[list[bytes | memoryview]] = []
    for output in response.outputs:
        entry, data = _encode_output(output, output_format, arrays)
        outputs.append(entry)
        if data is not None:
            binary.append(data)
    document["outputs"] = outputs
    header = _json.dumps_around(document, arrays) if arrays else [_json.dumps(document)]
    if not binary:
        return EncodedResponse(_JSON_HEADERS, tuple(header), bool(arrays))
    size = sum(len(piece) for piece in header)
    headers = (("content-type", BINARY_CONTENT_TYPE), (HEADER_LENGTH, str(size)))
    return EncodedResponse(headers, (*header, *(data for data in binary if data.nbytes)))


def body_length(body: Body) -> int:
    """The Content-Length of ``body``."""
    if isinstance(body, bytes):
        return len(body)
    pieces = body.pieces if isinstance(body, LentBody) else body
    return sum(len(piece) for piece in pieces)


#: Pieces of a body are written this many bytes or more at a time (one encoded slice, about):
#: each write is short, and the event loop serves the other connections between them.
BATCH: Final = 1 << 18


def body_batches(pieces: tuple[bytes | memoryview, ...]) -> list[list[bytes | memoryview]]:
    """``pieces`` in consecutive groups of about :data:`BATCH` bytes, to write one at a time."""
    batches: list[list[bytes | memoryview]] = [[]]
    size = 0
    for piece in pieces:
        if size >= BATCH:
            batches.append([])
            size = 0
        batches[-1].append(piece)
        size += len(piece)
    return batches


def json_output_bytes(response: InferResponse, output_format: OutputFormat) -> int:
    """The raw bytes of the outputs that are to be written as JSON (what encoding them costs)."""
    return sum(
        memoryview(output.data).nbytes
        for output in response.outputs
        if not output_format.is_binary(output.name)
    )


def _document(response: InferResponse) -> dict[str, Any]:
    """The response's JSON document without its outputs."""
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    if response.parameters:
        document["parameters"] = dict(response.parameters)
    return document


def _encode_output(
    output: InferOutput, output_format: OutputFormat, arrays: list[list[bytes | memoryview]]
) -> tuple[dict[str, Any], memoryview | None]:
    """An output's entry, and its bytes if they follow the JSON header; a large JSON array's
    pieces go to ``arrays`` (the entry holds :data:`_json.PLACEHOLDER` in their place)."""
    entry: dict[str, Any] = {
        "name": output.name,
        "datatype": output.datatype,
        "shape": list(output.shape),
    }
    parameters: dict[str, Any] = dict(output.parameters)
    if output.name in output_format.shared_memory or _SHM_REGION in parameters:
        return _in_shared_memory(entry, parameters), None
    data = output_bytes(output)
    if output_format.is_binary(output.name):
        parameters["binary_data_size"] = data.nbytes
        entry["parameters"] = parameters
        return entry, data
    if parameters:
        entry["parameters"] = parameters
    pieces = json_pieces_from_output(output.name, output.datatype, output.shape, data)
    if pieces is None:
        entry["data"] = json_from_output(output.name, output.datatype, output.shape, data)
    else:
        entry["data"] = _json.PLACEHOLDER
        arrays.append(pieces)
    return entry, None


def _in_shared_memory(entry: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """The entry of an output the core wrote into the client's region: nothing goes back but
    the model's own parameters. Triton adds no shared_memory_* parameters here, and the C++
    client (perf_analyzer) takes an output's "parameters" to hold binary_data_size."""
    kept = {k: v for k, v in parameters.items() if not k.startswith(_SHM_PREFIX)}
    if kept:
        entry["parameters"] = kept
    return entry
