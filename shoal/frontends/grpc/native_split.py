"""A large ``ModelInferRequest`` received in parts: its big ``raw_input_contents`` entries go
straight into blocks of the frontend worker's input arena as their bytes arrive, the rest of
the message into a buffer for protobuf.

Received whole, a 4 MiB request is copied from the DATA frames into a message buffer, and from
there into the worker's arena, where the stub reads it. Here the message's top-level fields
are followed as the bytes stream in (a tag and a length, then the value): the value of a
``raw_input_contents`` entry of :data:`RECEIVE_FROM` bytes or more is copied once, into a block
the arena gives (:class:`ReceiveArena`), and the block travels to the core as it is. Anything
unusual (a field that is not length-delimited, a length past the message's end, more than
:data:`~shoal.frontends.grpc._wire.MAX_WALKED_FIELDS` fields) stops the following: the bytes
from there on go to the buffer, and the usual decoding (``_infer.decode_infer_request``) reads
and judges them.

Every block received belongs to the call until the arena hands it to the core
(``place``); :meth:`SplitRequest.release` gives back those it did not, when the call is over
(answered, failed, reset by the client, or cut off mid-message).
"""

from __future__ import annotations

from typing import Final, Protocol

from shoal.frontends.grpc._wire import MAX_WALKED_FIELDS

#: ``ModelInferRequest.raw_input_contents``: the field whose large entries are received apart.
RAW_INPUT_CONTENTS: Final = 7
#: An entry of at least this many bytes is received into the arena; a smaller one stays in
#: the message (placing it would cost more than the copy it saves).
RECEIVE_FROM: Final = 64 * 1024
#: A message of at least this many bytes is received in parts.
SPLIT_FROM: Final = RECEIVE_FROM
_LENGTH_DELIMITED: Final = 2
_NOTHING: Final = memoryview(b"")
#: A tag (5 bytes at most for field numbers below 2**29) and a length (10 at most).
_HEAD_MAX: Final = 15


class ReceiveArena(Protocol):
    """Where large raw entries are received: the frontend worker's input arena."""

    def receive(self, nbytes: int) -> tuple[memoryview, object] | None:
        """A writable view of a fresh block of ``nbytes`` and a token for :meth:`discard`;
        None when none is to be had."""

    def discard(self, token: object) -> None:
        """Free a block :meth:`receive` gave, unless it was handed on (``place``)."""


class SplitRequest:
    """A received ``ModelInferRequest``: ``rest`` holds its wire bytes but the values of the
    entries received apart; :meth:`entries` puts all entries back in the message's order."""

    __slots__ = ("_arena", "_order", "_received", "rest")

    def __init__(
        self,
        rest: bytearray,
        order: list[memoryview | None],
        arena: ReceiveArena,
        received: list[object],
    ) -> None:
        self.rest = rest
        self._order = order  # the entries received apart (read-only), None for one in rest
        self._arena = arena
        self._received = received

    def entries(self, in_rest: list[memoryview]) -> list[memoryview]:
        """Every ``raw_input_contents`` entry in order, given those found in ``rest``."""
        pending = iter(in_rest)
        merged = [next(pending) if entry is None else entry for entry in self._order]
        merged.extend(pending)  # entries after the following stopped
        return merged

    def release(self) -> None:
        """The call is over: blocks not handed on go back to the arena."""
        received, self._received = self._received, []
        for token in received:
            self._arena.discard(token)


class InferSplitter:
    """Follows one message of ``size`` bytes as its pieces arrive (see the module)."""

    def __init__(self, arena: ReceiveArena, size: int) -> None:
        self._arena = arena
        self._left = size  # bytes of the message not yet seen
        self._head = bytearray()  # a field's tag and length, while they arrive
        self._rest = bytearray()
        self._order: list[memoryview | None] = []
        self._received: list[object] = []  # the tokens of the blocks received into
        self._fields = 0
        self._passing = False  # whether the rest goes to the buffer as it comes
        self._due = 0  # bytes of the current field's value not yet seen
        self._filled = 0
        # Where the current value goes: a block, or None (the buffer). Set here, not in the
        # class body (a mypyc class-level None default of an Optional is left undefined).
        self._target: memoryview | None = None

    def feed(self, piece: memoryview) -> None:
        """Take the next bytes of the message."""
        while piece:
            if self._due:
                piece = self._value(piece)
            elif self._passing:
                self._rest += piece
                self._left -= len(piece)
                return
            else:
                piece = self._read_head(piece)

    def receive_buffer(self, nbytes: int) -> memoryview | None:
        """The rest of the block the current value goes to, ``nbytes`` at most: where the next
        bytes may be read straight into (then :meth:`placed`); None when they go elsewhere."""
        target = self._target
        due = self._due
        if target is None or not due:
            return None
        filled = self._filled
        return target[filled : filled + min(nbytes, due)]

    def placed(self, nbytes: int) -> None:
        """The next ``nbytes`` of the message were read into :meth:`receive_buffer`'s view."""
        self._filled += nbytes
        self._due -= nbytes
        self._left -= nbytes

    def result(self) -> SplitRequest:
        """The whole message: its parts (a field cut off at the end stays in ``rest``,
        where decoding finds it malformed)."""
        self._rest += self._head
        self._head = bytearray()
        return SplitRequest(self._rest, self._order, self._arena, self._received)

    def release(self) -> None:
        """The message will not be finished: its blocks go back."""
        self.result().release()

    def _value(self, piece: memoryview) -> memoryview:
        """Copy what ``piece`` holds of the current value; return the rest of ``piece``.
        (Called per DATA frame: a piece inside the value, the usual case, is not sliced.)"""
        size = len(piece)
        rest = _NOTHING
        if size > self._due:
            size = self._due
            rest = piece[size:]
            piece = piece[:size]
        target = self._target
        if target is None:
            self._rest += piece
        else:
            filled = self._filled
            target[filled : filled + size] = piece
            self._filled = filled + size
        self._due -= size
        self._left -= size
        return rest

    def _read_head(self, piece: memoryview) -> memoryview:
        """Take the next field's tag and length from ``piece``; return the rest of ``piece``."""
        head = self._head
        before = len(head)
        head += piece[: _HEAD_MAX - before]
        parsed = _field_head(head)
        if parsed is None:
            if len(head) >= _HEAD_MAX or len(head) - before >= self._left:
                return self._pass(piece, before)  # malformed: decoding says so
            self._left -= len(piece)  # all of it is in the head, still incomplete
            return piece[len(piece) :]
        number, length, size = parsed
        taken = size - before
        if not number or length > self._left - taken or self._fields >= MAX_WALKED_FIELDS:
            return self._pass(piece, before)
        self._fields += 1
        self._left -= taken
        self._head = bytearray()
        self._begin_value(number, length, head[:size])
        return piece[taken:]

    def _begin_value(self, number: int, length: int, head: bytearray) -> None:
        """Route the value of field ``number`` (``length`` bytes; ``head``: its tag and length)."""
        self._due = length
        self._filled = 0
        self._target = None
        if number == RAW_INPUT_CONTENTS:
            received = self._arena.receive(length) if length >= RECEIVE_FROM else None
            if received is not None:
                view, token = received
                self._target = view
                self._received.append(token)
                self._order.append(view.toreadonly())
                return
            self._order.append(None)
        self._rest += head

    def _pass(self, piece: memoryview, before: int) -> memoryview:
        """Stop following fields: the head so far and all that follows go to the buffer."""
        self._rest += self._head[:before]
        self._head = bytearray()
        self._passing = True
        return piece


def _field_head(head: bytearray) -> tuple[int, int, int] | None:
    """(field number, value length, bytes of tag and length) of the field whose tag starts
    ``head``; None if they have not all arrived. Number 0 for a field not followed (not
    length-delimited, or numbered 0): _read_head passes it on."""
    key, at = _varint(head, 0)
    if at < 0:
        return None
    if key & 7 != _LENGTH_DELIMITED or key >> 3 == 0:
        return 0, 0, at
    length, end = _varint(head, at)
    if end < 0:
        return None
    return key >> 3, length, end


def _varint(data: bytearray, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where it ends; (0, -1) if it is cut off."""
    value = shift = 0
    for index in range(at, min(at + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    return 0, -1
