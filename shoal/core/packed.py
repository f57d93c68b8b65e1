"""A request a frontend worker checked, staged and packed: its call's frame, both sides.

The worker's side is ``frontends/workers/packing.py``; the core's, ``supervisor/requests/packed.py``
and ``InferenceService.start_packed``. Here, because both the worker link's host (a frontend)
and the service (the supervisor) name it, and the worker's writer and the core's reader of the
frame belong side by side.

The core reads the few fields it schedules a packed call with on every request, so they travel
as one fixed layout read with one ``struct`` unpack, where every other frame's header is a
MessagePack list (decoded into a list, its strings and its numbers). The frame's prefix is
every frame's (``_wire.frame``); its header starts with :data:`MARK`, a byte MessagePack never
writes, which is how the core's reader tells the two apart (``_wire.FrameReader``); its one
payload is the packed record's head.

Header, little-endian: the mark, a flags byte (:data:`TRACED`: the worker's frontend will send
its trace timestamps, the core holds the request's trace for them), two bytes of padding, the
call id (u64), the model
version's slot (u32: the ``(model, version)`` the worker's snapshot was for, as the core
numbered it: ``requests/packed.py``), the snapshot's generation (i64), the batch size (u32),
the timeout (µs, i64), the private inputs (a u64 mask), how many block numbers follow (u32),
the request id's length (u32), the shape key's length (u32); then the block numbers
(``[segment, offset, nbytes] * n``, u64 each), the request id (UTF-8) and the shape key.

The shape key is what the dynamic batcher groups requests by (:func:`shape_key`: requests
share a batch only when theirs are equal): the worker builds it from the request's model shapes
as the core builds it from a record's (``schedulers/_batching.shape_key``), with the same
function, so a packed request and one that went the core's way batch together when their shapes
agree. Empty for a model whose batcher reads none.
"""

from __future__ import annotations

import struct
from typing import Final

from shoal.core.types import InferRequest
from shoal.ipc.arena import Block

#: A packed call's first header byte: 0xC1, which MessagePack never uses (every other header
#: is a MessagePack array, whose first byte is 0x90-0x9F, 0xDC or 0xDD).
MARK: Final = 0xC1

_PREFIX: Final = struct.Struct("<II")  # every frame's (``_wire._PREFIX``): header, payload lengths
_CALL_ID: Final = struct.Struct("<BB2xQ")
_FIELDS: Final = struct.Struct("<IqIqQIII")
_HEADER: Final = struct.Struct("<BB2xQIqIqQIII")
#: The flags byte's bit for a request whose frontend sends its trace timestamps (its
#: ``InferRequest.trace_id`` is -1 in the worker).
TRACED: Final = 1
_NUMBER: Final = struct.Struct("<Q")
#: A shape key's entry per input: the name's length and how many dimensions follow.
_KEY_ENTRY: Final = struct.Struct("<II")
_DIM: Final = struct.Struct("<q")


#: Shape keys built (:func:`shape_key`), by their pairs: a client sends requests of one shape
#: after another, and a key built anew cost the core ~2,700 instructions a request. Cleared
#: when full (shapes are checked against the model's config before a key is asked for, so a
#: client cannot make one large; it could make many).
_KEYS: Final[dict[tuple[tuple[str, tuple[int, ...]], ...], bytes]] = {}
_MAX_KEYS: Final = 1024


def shape_key(given: list[tuple[str, tuple[int, ...]]]) -> bytes:
    """The dynamic batcher's shape key of a request's ``(input name, dims)`` pairs (the dims
    that must agree, or none for an input that only has to be given): bytes, the same whichever
    side builds them, whatever order the inputs came in."""
    given.sort()  # by name: the names of one request's inputs are unique
    pairs = tuple(given)
    key = _KEYS.get(pairs)
    if key is None:
        key = _key_bytes(pairs)
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        _KEYS[pairs] = key
    return key


#: One-input keys built (:func:`one_key`), by ``(name, dims)``: the usual batched model has one
#: input, and its key needs no list of pairs, no sort and no tuple of them. Bounded as
#: :data:`_KEYS`.
_ONE_KEYS: Final[dict[tuple[str, tuple[int, ...]], bytes]] = {}


def one_key(name: str, dims: tuple[int, ...]) -> bytes:
    """``shape_key([(name, dims)])`` (the same bytes), for a request with one input that counts."""
    pair = (name, dims)
    key = _ONE_KEYS.get(pair)
    if key is None:
        key = _key_bytes((pair,))
        if len(_ONE_KEYS) >= _MAX_KEYS:
            _ONE_KEYS.clear()
        _ONE_KEYS[pair] = key
    return key


def reshape_sources(
    expected: tuple[int, ...], reshape: tuple[int, ...] | None, batched: bool
) -> tuple[int, ...]:
    """Where in a request's shape the values of ``reshape``'s -1 dimensions are, in order
    (``expected``: the configured dims, after the batch dimension's -1 when ``batched``): the
    configured dims' own -1s, as Triton fills them (``InferenceRequest::Normalize``; the
    config's rules, ``validation._check_reshape``, make the counts agree). Empty when the
    reshape has no -1, or there is no reshape."""
    if reshape is None or -1 not in reshape:
        return ()
    first = 1 if batched else 0
    return tuple(i for i in range(first, len(expected)) if expected[i] == -1)


def model_shape(
    shape: tuple[int, ...],
    reshape: tuple[int, ...] | None,
    sources: tuple[int, ...],
    batched: bool,
) -> tuple[int, ...]:
    """The shape the model sees of an input given as ``shape`` (already checked against the
    configured dims): its ``reshape`` after the batch dimension, each -1 of it resolved from
    the request (``sources``: :func:`reshape_sources`). Both sides stage it and build the
    dynamic batcher's key from it: a -1 left as written would let requests of different
    shapes share a batch."""
    if reshape is None:
        return shape
    if not sources:
        return (shape[0], *reshape) if batched else reshape
    resolved = [shape[0]] if batched else []
    at = 0
    for dim in reshape:
        if dim == -1:
            resolved.append(shape[sources[at]])
            at += 1
        else:
            resolved.append(dim)
    return tuple(resolved)


def _key_bytes(pairs: tuple[tuple[str, tuple[int, ...]], ...]) -> bytes:
    parts: list[bytes] = []
    for name, dims in pairs:
        raw = name.encode()
        parts.append(_KEY_ENTRY.pack(len(raw), len(dims)))
        parts.append(raw)
        for dim in dims:
            parts.append(_DIM.pack(dim))
    return b"".join(parts)


def encode(
    slot: int,
    generation: int,
    request_id: str,
    batch_size: int,
    timeout_us: int,
    private_inputs: int,
    blocks: list[int],
    key: bytes = b"",
) -> bytes | None:
    """A packed call's header after its call id (the worker's side); None when a field does
    not fit its place (a timeout past 63 bits, a 65th input placed, ...): the request then
    goes the core's way."""
    try:
        request_id_bytes = request_id.encode()
        fields = _FIELDS.pack(
            slot,
            generation,
            batch_size,
            timeout_us,
            private_inputs,
            len(blocks),
            len(request_id_bytes),
            len(key),
        )
        numbers = [_NUMBER.pack(n) for n in blocks]
        return b"".join([fields, *numbers, request_id_bytes, key])
    except (struct.error, OverflowError, UnicodeEncodeError):
        return None


def frame(call_id: int, encoded: bytes, head: bytes, flags: int = 0) -> list[bytes | memoryview]:
    """The pieces of a packed call's frame (``encoded``: :func:`encode`'s bytes)."""
    size = _CALL_ID.size + len(encoded)
    return [_PREFIX.pack(size, len(head)), _CALL_ID.pack(MARK, flags, call_id), encoded, head]


class PackedCall:
    """One relayed request as the core reads it: its header's fields (``view[start:end]``),
    ``head`` its packed record, ``blocks`` the worker's blocks it names once the core took them
    (they go back to the worker as any input block does)."""

    def __init__(
        self, view: memoryview | bytes, start: int, end: int, head: bytes | memoryview
    ) -> None:
        (
            mark,
            flags,
            call_id,
            slot,
            generation,
            batch_size,
            timeout_us,
            private,
            count,
            id_size,
            key_size,
        ) = _HEADER.unpack_from(view, start)
        at = start + _HEADER.size
        numbers: list[int] = []
        for _ in range(count):  # none for a small request: no format made per call
            numbers.append(_NUMBER.unpack_from(view, at)[0])
            at += _NUMBER.size
        if mark != MARK or at + id_size + key_size != end:
            raise ValueError("a packed call's header does not add up")
        self.call_id: int = call_id
        #: The worker's frontend sends the request's trace timestamps (:data:`TRACED`).
        self.traced: bool = bool(flags & TRACED)
        self.slot: int = slot
        self.generation: int = generation
        self.batch_size: int = batch_size
        self.timeout_us: int = timeout_us
        self.private_inputs: int = private
        #: ``[segment, offset, nbytes] * n`` of the worker's blocks it names.
        self.numbers = numbers
        self.request_id = str(view[at : at + id_size], "utf-8")
        #: What the dynamic batcher groups it by (:func:`shape_key`; empty where it reads none).
        self.shape_key = bytes(view[at + id_size : end])
        self.head = head
        self.blocks: list[Block] = []
        #: What the answer names (no inputs: the stub has them; no outputs in a client's
        #: region), made once the core knows the model version (``requests/packed.admit``).
        self.request: InferRequest | None = None
        #: Set when the worker's snapshot of the model is stale (or the model is gone): it
        #: drops it and sends the request the core's own way.
        self.stale = False
