"""A call's request messages on shoal's own gRPC server: gRPC's length-prefixed messages cut
out of the stream's DATA, into buffers kept for reuse when large, inflated when compressed."""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

from shoal.frontends.grpc.native_split import SPLIT_FROM, InferSplitter, SplitRequest

#: A message announcing at most this many bytes gets its buffer at once; a larger one's grows as
#: its bytes arrive.
_PREALLOCATE: Final = 64 * 1024
#: What one zlib call inflates, at most.
_INFLATE_PIECE: Final = 1 << 20
#: A message's prefix read: compressed or not, and its size (bound once: compiled, a call of a
#: struct's method looks it up first).
_prefix_fields: Final = struct.Struct(">BI").unpack_from
_PREFIX_SIZE: Final = 5
#: A message smaller than this, whole in one payload, is read at once (MessageReader.feed):
#: one neither split nor pooled, and whose size is held whole.
_WHOLE_BELOW: Final = min(SPLIT_FROM, _PREALLOCATE + 1)

Message = bytes | bytearray | memoryview | SplitRequest
#: What makes the splitter of a large message (see native_split), given its size; None when
#: there is none for it.
Splitting = Callable[[int], InferSplitter | None]


class BufferPool:
    """Large request buffers, kept for reuse.

    A fresh multi-megabyte ``bytearray`` is zero-filled and page-faulted in on every request: a
    fifth of the supervisor's time per 4 MiB call. A buffer comes back only once no view of it
    is left (a bytearray with live views cannot be resized, which is what ``give_back`` tries).
    """

    MIN_SIZE: Final = 256 * 1024
    MAX_SIZE: Final = 16 * 1024 * 1024  # with KEEP, at most 64 MiB kept
    KEEP: Final = 4

    def __init__(self) -> None:
        self._free: list[bytearray] = []

    def take(self, size: int) -> bytearray | None:
        """A kept buffer of at least ``size`` bytes; None (allocate nothing) when none fits."""
        fitting = [b for b in self._free if len(b) >= size]
        if not fitting:
            return None
        buffer = min(fitting, key=len)
        self._free.remove(buffer)
        return buffer

    def give_back(self, buffer: bytearray) -> None:
        if len(buffer) > self.MAX_SIZE:
            return
        try:
            buffer.append(0)
            del buffer[-1]
        except BufferError:
            return  # something still reads it: leave it to the garbage collector
        if len(self._free) >= self.KEEP:
            self._free.remove(min(self._free, key=len))
        self._free.append(buffer)


class ConnectionBudget:
    """The request bytes one connection's calls hold and have not handed on yet (messages
    arriving, and received ones no handler has taken): bounded across all its streams, so that
    a client's memory is not the message limit times its streams."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class MessageReader:
    """Cuts the length-prefixed messages of one call out of its DATA.

    Each whole message goes to ``on_message(message, compressed)``; one announcing more than
    ``max_bytes`` to ``on_too_large(size)``, and nothing is read after it. ``pooled``: a message
    of a unary call may be received into a buffer of ``pool`` (given back by :meth:`release`,
    once the call is over). ``hold(size)`` counts the bytes of a message as they arrive (a small
    one's all at once, as its buffer is made); when it says no, nothing more is read.
    ``split``: a large uncompressed message may be received in parts instead
    (:class:`~shoal.frontends.grpc.native_split.SplitRequest`), its large tensors straight into
    the arena they are staged in.
    """

    _pooled: bytearray | None = None  # the buffer under a pooled message
    _expected = 0  # the size of the message being received
    _filled = 0
    _growing = False  # whether it is received into a buffer that grows as it comes
    _held_whole = False  # whether its whole size was held when it began
    _compressed = False
    closed = False  # set by the call once it is over: nothing more is read

    def __init__(
        self,
        pool: BufferPool,
        max_bytes: int,
        pooled: bool,
        on_message: Callable[[Message, bool], None],
        on_too_large: Callable[[int], None],
        hold: Callable[[int], bool],
        split: Splitting | None = None,
    ) -> None:
        self._split = split
        self._pool = pool
        self._hold = hold
        self._max_bytes = max_bytes
        self._pooled_allowed = pooled
        self._on_message = on_message
        self._on_too_large = on_too_large
        self._prefix = bytearray()
        # Set here, not in the class body: mypyc drops a class-level None default of a union
        # of more than one type and None (the attribute would be undefined when compiled).
        self._message: bytearray | memoryview | None = None
        self._splitter: InferSplitter | None = None  # the message's, when received in parts

    def mid_message(self) -> bool:
        """Whether part of a message has arrived and the rest is due."""
        return self._message is not None or self._splitter is not None or bool(self._prefix)

    def feed_pieces(self, pieces: list[memoryview]) -> None:
        """Take the payloads of a run of DATA frames (see FrameReader). A run that continues
        the message being received and does not finish it (most runs of a large message: 16
        frames of 16 KiB a read) is counted against the budget once and copied on, with
        nothing else per frame."""
        if len(pieces) > 1 and not self._held_whole and not self.closed:
            size = 0
            for piece in pieces:
                size += len(piece)
            if self._filled + size < self._expected and self._continue(pieces, size):
                return
        for piece in pieces:
            self.feed(piece)

    def _continue(self, pieces: list[memoryview], size: int) -> bool:
        """Copy ``pieces`` (``size`` bytes, all inside the message being received) on;
        False when no message is being received."""
        splitter = self._splitter
        message = self._message
        if splitter is None and message is None:
            return False
        if not self._hold(size):
            return True
        if splitter is not None:
            for piece in pieces:
                splitter.feed(piece)
        elif isinstance(message, bytearray) and self._growing:
            for piece in pieces:
                message += piece
        else:
            assert message is not None
            filled = self._filled
            for piece in pieces:
                message[filled : filled + len(piece)] = piece
                filled += len(piece)
        self._filled += size
        return True

    def feed(self, data: memoryview) -> None:
        """Take a DATA payload: called per frame when not by runs (feed_pieces), so a payload
        that only continues a message is copied with as little else as possible."""
        view = data
        if self._whole_message(view):
            return
        while view and not self.closed:
            message = self._message
            splitter = self._splitter
            if message is None and splitter is None:
                view = self._read_prefix(view)
                continue
            filled = self._filled
            size = self._expected - filled
            whole = size >= len(view)  # the payload ends inside the message, or with it
            if whole:
                size = len(view)
            if not self._held_whole and not self._hold(size):
                return
            piece = view if whole else view[:size]
            if splitter is not None:
                splitter.feed(piece)
            elif self._growing:
                assert isinstance(message, bytearray)
                message += piece
            else:
                assert message is not None
                message[filled : filled + size] = piece
            self._filled = filled = filled + size
            if filled == self._expected:
                self._message_done()
            if whole:
                return
            view = view[size:]

    def _whole_message(self, view: memoryview) -> bool:
        """Read a payload that is one small message, prefix and all (a small unary call's): as
        the general walk would (_read_prefix, _begin_message, feed), without the prefix's
        buffer, its slices and the message's buffer filled apart. False for any other."""
        if self._message is not None or self._splitter is not None or self._prefix:
            return False  # inside a message, or its prefix
        if self.closed:
            return False
        size = whole_size(view, self._max_bytes)
        if size < 0:
            return False
        self._compressed = view[0] != 0
        self._expected = self._filled = size
        self._growing = False
        self._held_whole = True
        if self._hold(size):
            # bytes, not a bytearray: the same one copy, and the decode then reads it as it is
            # (a bytearray's views need making read-only, and its walk a copy as bytes).
            self._on_message(bytes(view[_PREFIX_SIZE:]), self._compressed)
        return True

    def receive_buffer(self, nbytes: int) -> memoryview | None:
        """Where up to ``nbytes`` of the message may be read straight into (then
        :meth:`placed`): the rest of the arena block of the large tensor being received."""
        splitter = self._splitter
        if splitter is None or self.closed:
            return None
        return splitter.receive_buffer(min(nbytes, self._expected - self._filled))

    def placed(self, nbytes: int) -> None:
        """``nbytes`` were read into :meth:`receive_buffer`'s view: counted as :meth:`feed`
        counts a payload, without the copy."""
        splitter = self._splitter
        if splitter is None or self.closed:
            return
        if not self._held_whole and not self._hold(nbytes):
            return
        splitter.placed(nbytes)
        self._filled += nbytes
        if self._filled == self._expected:
            self._message_done()

    def release(self) -> None:
        """The call is over: its pooled buffer goes back to the pool, the blocks of a message
        cut off while received in parts to their arena."""
        splitter, self._splitter = self._splitter, None
        if splitter is not None:
            splitter.release()
        if self._pooled is not None:
            self._pool.give_back(self._pooled)
            self._pooled = None

    def detach(self) -> None:
        """The call is over: nothing more is read, and the call's callbacks are let go (bound
        methods of the call, which refers to this reader: a cycle per call, which only the
        collector would free)."""
        self.closed = True
        self._on_message, self._on_too_large, self._hold = _DETACHED

    def _read_prefix(self, view: memoryview) -> memoryview:
        """Take the bytes of the next message's prefix from ``view``; return the rest."""
        need = 5 - len(self._prefix)
        self._prefix += view[:need]
        if len(self._prefix) == 5:
            prefix, self._prefix = self._prefix, bytearray()
            self._begin_message(prefix)
        return view[need:]

    def _begin_message(self, prefix: bytearray) -> None:
        size = int.from_bytes(prefix[1:5], "big")
        if size > self._max_bytes:
            self._on_too_large(size)
            return
        self._compressed = bool(prefix[0])
        self._expected = size
        self._filled = 0
        self._growing = False
        self._held_whole = size <= _PREALLOCATE
        if self._held_whole and not self._hold(size):
            return
        if size >= SPLIT_FROM and not self._compressed and self._split is not None:
            self._splitter = self._split(size)
            if self._splitter is not None:
                return
        self._message = self._buffer(size)
        if size == 0:
            self._message_done()

    def _buffer(self, size: int) -> bytearray | memoryview:
        """Where a message of ``size`` bytes is received."""
        poolable = size >= BufferPool.MIN_SIZE and self._pooled_allowed and self._pooled is None
        pooled = self._pool.take(size) if poolable else None
        if pooled is not None:
            self._pooled = pooled
            return memoryview(pooled)[:size]
        if size <= _PREALLOCATE:
            return bytearray(size)
        # The length prefix is only a claim: the message grows as its bytes arrive (two
        # streams announcing 2 GiB and sending nothing cost nothing). A unary call's buffer
        # joins the pool afterwards, so repeated large calls reuse it.
        self._growing = True
        message = bytearray()
        if poolable:
            self._pooled = message
        return message

    def _message_done(self) -> None:
        splitter, self._splitter = self._splitter, None
        received: Message | None = self._message if splitter is None else splitter.result()
        self._message = None
        assert received is not None
        self._on_message(received, self._compressed)


def whole_size(view: memoryview, max_bytes: int) -> int:
    """The size of the one message a DATA payload holds whole, prefix and all, when it is
    small (not split, not pooled, held whole: below ``_WHOLE_BELOW``) and within
    ``max_bytes``; -1 for any other payload (it goes the general way)."""
    if len(view) < _PREFIX_SIZE:
        return -1
    size: int = _prefix_fields(view)[1]
    if len(view) != _PREFIX_SIZE + size or size > max_bytes or size >= _WHOLE_BELOW:
        return -1
    return size


class Compressed:
    """A request message as it came, compressed."""

    __slots__ = ("message",)

    def __init__(self, message: bytes | bytearray) -> None:
        self.message = message


class Inbox:
    """The request messages of a streaming call, as an async iterator; compressed ones are
    inflated as they are taken, off the event loop when large (:func:`inflate`)."""

    def __init__(
        self,
        inflate: Callable[[bytes | bytearray], Awaitable[bytes | bytearray]],
        taken: Callable[[int], None],
    ) -> None:
        self._items: deque[bytes | bytearray | Compressed | None] = deque()  # None: no more
        self._waiter: asyncio.Future[None] | None = None
        self._inflate = inflate
        self._taken = taken  # told the size of each message the handler takes

    def put(self, item: bytes | bytearray | Compressed | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> bytes | bytearray:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item is None:
            self._items.appendleft(None)
            raise StopAsyncIteration
        self._taken(len(item.message) if isinstance(item, Compressed) else len(item))
        if isinstance(item, Compressed):
            return await self._inflate(item.message)
        return item


def inflate(message: bytes | bytearray, wbits: int, limit: int) -> bytearray | None:
    """``message`` inflated; None past ``limit`` bytes (checked after each piece).

    Inflated a piece at a time into one growing buffer: zlib releases the GIL while it
    inflates, but one call for the whole message would also assemble its output (a gigabyte
    copy) with the GIL held, stalling the event loop for seconds.
    """
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending: bytes | bytearray = message
    while True:
        piece = inflater.decompress(pending, _INFLATE_PIECE)
        out += piece
        if len(out) > limit:
            return None
        pending = inflater.unconsumed_tail
        if not pending and len(piece) < _INFLATE_PIECE:
            return out


def _dropped(message: Message, compressed: bool) -> None:
    """A released reader's stand-in for its call's message callback."""


def _ignored(size: int) -> None:
    """A released reader's stand-in for its call's too-large callback."""


def _refused(size: int) -> bool:
    """A released reader's stand-in for its call's budget: nothing more is held."""
    return False


#: The three stand-ins, read once: compiled, a module's function named as a value is a look-up
#: in the module's dict at each use (three per call in ``detach``); a Final is a C static.
_DETACHED: Final = (_dropped, _ignored, _refused)
