"""A frontend worker's side of the relay: requests checked, staged and packed for the stub here.

The core's checks of a request read its model's summary (``supervisor/requests/summary.py``); a
worker holds a snapshot of it per model version (:class:`Snapshot`, asked for once:
``packing_summary``) and checks each request against it. A request that passes is staged here
(inputs inline in its record up to the model's budget, the rest in the worker's arena) and its
stub record packed up to ``timeout_us`` (:func:`prepare`): the core reads a few scheduling fields
and splices the bytes into the Execute, never building the request's objects, checking or
staging it (``supervisor/requests/packed.py``).

Only the happy path is decided here: a request that fails a check, or that anything makes
unusual (sequence parameters, client shared memory, classification, JSON arrays, non-ASCII
text, a full arena), is sent the core's own way, so every error is the core's, word for word.
The core may still refuse a relayed request (the model was reloaded or unloaded: the snapshot's
generation is stale; it is not ready, or draining): the worker then sends it again the core's
own way, with the blocks it staged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, cast

import msgpack

from shoal.core.packed import encode, model_shape, one_key, shape_key
from shoal.core.types import InferInput, InferRequest
from shoal.frontends.workers.head_bytes import (
    array_header,
    array_of_str,
    desc_bytes,
    int_bytes,
    shape_bytes,
    str_bytes,
)
from shoal.frontends.workers.snapshots import Rule, Snapshot, Snapshots
from shoal.ipc.arena import Block
from shoal.ipc.dtypes import BytesFormatError, deserialize_bytes, element_count
from shoal.ipc.tensor import INLINE_TENSOR_MAX, InlineBytes

__all__ = ["PackedRefused", "Prepared", "Restage", "Snapshot", "Snapshots", "prepare"]

#: ``staging.MAX_ELEMENTS``: past it the core refuses a shape even with a zero dimension.
MAX_ELEMENTS: Final = 1 << 48

#: Request parameters the core turns into a record's sequence fields: such requests (for a
#: model without a sequence batcher) take its path.
_SEQUENCE: Final = frozenset({"sequence_id", "sequence_start", "sequence_end"})
#: Parameters of a tensor that the core handles itself: client shared memory, classification.
_REGION: Final = "shared_memory_region"
_CLASSIFICATION: Final = "classification"
#: The other parameter values that cross to the stub as they are.
_SCALARS: Final = (int, float, bool)
#: What an input's raw bytes may be held in (a tuple: ``bytes | bytearray | memoryview``
#: would build a union object per call).
_RAW: Final = (bytes, bytearray, memoryview)
#: Compiled, the builtin's name is a look-up on the ``builtins`` module at each use.
_memoryview: Final = memoryview

#: Places an input's bytes in the worker's arena, whatever their size; None: it is full.
Stage = Callable[[memoryview], Block | None]


class PackedRefused(Exception):
    """The core did not take a relayed call: send it again its own way (``stale``: the
    worker's snapshot of the model is out of date)."""

    def __init__(self, stale: bool) -> None:
        super().__init__("relayed call refused")
        self.stale = stale


class Restage:
    """The ``place`` of a request sent the core's way after it was staged for packing: each raw
    input in turn goes in the block it was staged in, else through ``place``."""

    def __init__(self, staged: list[Block | None], place: Stage | None) -> None:
        self._staged = iter(staged)
        self._place = place

    def __call__(self, view: memoryview) -> Block | None:
        block = next(self._staged, None)
        if block is None and self._place is not None:
            return self._place(view)
        return block


class Prepared:
    """A request staged for the relay: ``head`` to send (``packed`` False: it takes the core's
    path), and ``staged``, the block each input was placed in (None: inline), which a resend
    the core's way passes on as placed inputs; ``generation``, its snapshot's."""

    def __init__(self, request: InferRequest, snapshot: Snapshot) -> None:
        self.generation = snapshot.generation
        #: The record's head is packed: the request may go straight to a stub, or packed.
        self.packed = False
        self.head = b""
        self.staged: list[Block | None] = []
        self._request = request
        self._snapshot = snapshot
        self._fields: bytes | None = None

    @property
    def fields(self) -> bytes | None:
        """What the core reads of the packed call (``core/packed.py``); None where the request
        was not packed or one field does not fit its place. Encoded when first asked for: a
        request that goes straight to a stub never needs it."""
        if self._fields is None and self.packed:
            self._fields = _fields(self._request, self._snapshot, self.staged)
        return self._fields

    def blocks(self) -> list[Block]:
        return [block for block in self.staged if block is not None]


def prepare(request: InferRequest, snapshot: Snapshot, stage: Stage | None) -> Prepared | None:
    """``request`` checked against ``snapshot`` and staged, or None (nothing staged) where the
    core must see it: any check it would fail, anything unusual. ``stage`` places an input in
    the worker's arena (None: the worker has none, so only inline inputs are packed)."""
    views = _checked(request, snapshot)
    if views is None:
        return None
    prepared = Prepared(request, snapshot)
    descs = _staged(request, snapshot, views, stage, prepared.staged)
    if descs is None:  # the arena is full: the core's way, with what is staged so far
        return prepared
    prepared.head = _head(request, snapshot, descs)
    prepared.packed = True
    return prepared


def _staged(
    request: InferRequest,
    snapshot: Snapshot,
    views: list[memoryview],
    stage: Stage | None,
    staged: list[Block | None],
) -> list[bytes] | None:
    """Each input's descriptor on the wire: inline in the record up to the model's budget, else
    in a block of the worker's arena (appended to ``staged``, None for an inline one); None when
    the arena is full."""
    room = snapshot.inline_budget
    descs: list[bytes] = []
    for index, tensor in enumerate(request.inputs):
        view = views[index]
        nbytes = view.nbytes  # read once: a generic attribute look-up, compiled
        location: Block | InlineBytes | None = None
        if nbytes <= INLINE_TENSOR_MAX and nbytes <= room:
            room -= nbytes
            location = InlineBytes(bytes(view))
            staged.append(None)
        else:
            location = None if stage is None else stage(view)
            staged.append(location)
        if location is None:
            return None
        rule = snapshot.inputs[tensor.name]
        shape = _model_shape(snapshot, rule, tensor.shape)
        last = rule.last_shape
        if last[0] != shape:
            last = rule.last_shape = (shape, shape_bytes(shape))
        descs.append(desc_bytes(rule.name_type, last[1], location))
    return descs


def _timeout(request: InferRequest) -> Any:
    """The ``timeout`` parameter (µs; an integer, or the request is not packed)."""
    return request.parameters.get("timeout", 0) if request.parameters else 0


def _fields(request: InferRequest, snapshot: Snapshot, staged: list[Block | None]) -> bytes | None:
    """What the core reads of a packed call, encoded (``core/packed.py``); None where one does
    not fit its place."""
    return encode(
        snapshot.slot,
        snapshot.generation,
        request.id,
        _batch_size(snapshot, request),
        _timeout(request),
        _private(staged),
        _flat(staged),
        _key(request, snapshot) if snapshot.keyed else b"",
    )


def _key(request: InferRequest, snapshot: Snapshot) -> bytes:
    """The dynamic batcher's shape key of ``request``, from the shapes the model sees, as the
    core builds it from a record's inputs (``_batching.shape_key``)."""
    inputs = request.inputs
    if len(inputs) == 1:  # as the core's: the same bytes (``core.packed.one_key``)
        name = inputs[0].name
        if name in snapshot.key_inputs:
            shape = _model_shape(snapshot, snapshot.inputs[name], tuple(inputs[0].shape))
            return one_key(name, shape[1:])
        return one_key(name, ()) if snapshot.key_all else b""
    given: list[tuple[str, tuple[int, ...]]] = []
    for tensor in inputs:
        name = tensor.name
        if name in snapshot.key_inputs:
            shape = _model_shape(snapshot, snapshot.inputs[name], tuple(tensor.shape))
            given.append((name, shape[1:]))
        elif snapshot.key_all:
            given.append((name, ()))
    return shape_key(given)


def _private(staged: list[Block | None]) -> int:
    """The inputs in a block of their own (``RequestRecord.private_inputs``): the model may
    write them."""
    return sum(1 << index for index, block in enumerate(staged) if block is not None)


def _flat(staged: list[Block | None]) -> list[int]:
    """``[segment, offset, nbytes] * n`` of the blocks staged."""
    return [n for b in staged if b is not None for n in (b.segment, b.offset, b.nbytes)]


#: The record's array header (eleven fields), its two fields after the id (the sequence's:
#: none), and its parameters when it has none.
_ELEVEN: Final = b"\x9b"
_NO_SEQUENCE: Final = b"\x00\x00"
_NO_PARAMETERS: Final = b"\x80"


def _head(request: InferRequest, snapshot: Snapshot, descs: list[bytes]) -> bytes:
    """The record's first seven fields (``RequestRecord.to_wire`` up to ``timeout_us``: id, two
    sequence fields, parameters, outputs, inputs, timeout) as the start of its eleven-field
    array, written piece by piece (``head_bytes``); parameters through the Packer."""
    parameters = request.parameters
    timeout = _timeout(request)
    pieces = [
        _ELEVEN,
        str_bytes(request.id),
        _NO_SEQUENCE,
        _packer().pack(parameters) if parameters else _NO_PARAMETERS,
        _packed_outputs(request, snapshot),
        array_header(len(descs)),
    ]
    pieces.extend(descs)
    pieces.append(int_bytes(timeout) if type(timeout) is int else _packer().pack(timeout))
    return b"".join(pieces)


def _packed_outputs(request: InferRequest, snapshot: Snapshot) -> bytes:
    """The outputs ``request`` names, packed; the snapshot's, made once, where they are the
    model's own in order (as a client that names every output sends them), or none."""
    if not request.outputs:
        return snapshot.packed_outputs
    names = [output.name for output in request.outputs]
    return snapshot.packed_outputs if names == snapshot.outputs else array_of_str(names)


#: One packer per thread (``msgpack.packb`` makes one, and its buffer, per call).
_packers: Final = threading.local()


def _packer() -> msgpack.Packer:
    try:
        return _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
        return packer


def _checked(request: InferRequest, snapshot: Snapshot) -> list[memoryview] | None:
    """Each input's bytes when the core would accept the request as it is; None otherwise."""
    if not (_plain_parameters(request, snapshot) and _plain_outputs(request, snapshot)):
        return None
    count = len(request.inputs)
    if count < len(snapshot.required) or count > len(snapshot.inputs):
        return None
    views: list[memoryview] = []
    seen: set[str] = set()
    for tensor in request.inputs:
        view = _input_bytes(snapshot, tensor, seen)
        if view is None:
            return None
        views.append(view)
    return views if _required_given(snapshot, seen) else None


def _input_bytes(snapshot: Snapshot, tensor: InferInput, seen: set[str]) -> memoryview | None:
    """The bytes of an input the model has, given once, of its datatype and a shape and size
    the core accepts, in no client shared memory (added to ``seen``); None otherwise."""
    rule = snapshot.inputs.get(tensor.name)
    if rule is None or tensor.name in seen or tensor.datatype != rule.datatype:
        return None
    if tensor.parameters and _REGION in tensor.parameters:
        return None
    seen.add(tensor.name)
    shape = tuple(tensor.shape)
    if not _shape_ok(snapshot, rule, shape):
        return None
    return _bytes_ok(tensor.data, rule, shape)


def _required_given(snapshot: Snapshot, seen: set[str]) -> bool:
    return all(name in seen for name in snapshot.required)


def _plain_parameters(request: InferRequest, snapshot: Snapshot) -> bool:
    """No sequence fields, none the snapshot sends the core's way; ASCII text (the core's UTF-8
    check passes); an integer timeout."""
    if not request.id.isascii():
        return False
    core = snapshot.core_parameters
    for name, value in request.parameters.items():
        if name in _SEQUENCE or name in core or not _plain_value(name, value):
            return False
    return True


def _plain_value(name: str, value: object) -> bool:
    if not name.isascii():
        return False
    if name == "timeout":
        return type(value) is int
    if isinstance(value, str):
        return value.isascii()
    return type(value) in _SCALARS


def _plain_outputs(request: InferRequest, snapshot: Snapshot) -> bool:
    """Outputs the model has, each named once, none in client shared memory or asking for
    classes."""
    outputs = request.outputs
    if len(outputs) > 1 and len({output.name for output in outputs}) < len(outputs):
        return False  # the core refuses it in Triton's words
    for output in outputs:
        if output.name not in snapshot.output_names:
            return False
        params = output.parameters
        if params and (_REGION in params or _CLASSIFICATION in params):
            return False
    return True


def _shape_ok(snapshot: Snapshot, rule: Rule, shape: tuple[int, ...]) -> bool:
    """The core's shape checks: no negative dimension, not too many elements, the batch
    dimension within the model's, the configured dims."""
    elements = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            return False
        if dim:
            elements *= dim
    if elements > MAX_ELEMENTS:
        return False
    if snapshot.max_batch_size > 0 and (not shape or shape[0] > snapshot.max_batch_size):
        return False
    expected = rule.expected
    if len(expected) != len(shape):
        return False
    for index in range(len(shape)):  # not zip(): a call with a keyword per request
        wanted = expected[index]
        if wanted != -1 and wanted != shape[index]:
            return False
    return True


def _bytes_ok(data: object, rule: Rule, shape: tuple[int, ...]) -> memoryview | None:
    """The raw bytes of an input whose size (or BYTES framing) the shape agrees with; None for
    anything else (a JSON array: the core stages it). ``shape`` passed ``_shape_ok``: its
    dimensions are integers."""
    if type(data) is _memoryview:  # most requests' (a view of the body): used as it is
        view = cast("memoryview", data)
    elif isinstance(data, _RAW):
        view = _memoryview(data)
    else:
        return None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if (size := rule.item_size) is not None:
        expected = size
        for dim in shape:
            expected *= dim
        return view if view.nbytes == expected else None
    if rule.datatype == "BYTES":
        try:
            deserialize_bytes(view, element_count(shape))
        except BytesFormatError:
            return None
        return view
    return None  # a datatype without a size the core knows: its own words


def _model_shape(snapshot: Snapshot, rule: Rule, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the model sees (``staging._model_shape``)."""
    reshape = rule.reshape
    if reshape is None:
        return tuple(shape)
    return model_shape(tuple(shape), reshape, rule.reshape_sources, snapshot.max_batch_size > 0)


def _batch_size(snapshot: Snapshot, request: InferRequest) -> int:
    """``staging.batch_size``."""
    shape = request.inputs[0].shape if request.inputs else ()
    return int(shape[0]) if snapshot.max_batch_size > 0 and shape else 1
