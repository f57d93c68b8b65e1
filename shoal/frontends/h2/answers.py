"""A unary call's whole answer as one piece: its HEADERS, its one DATA frame and its trailers'
HEADERS packed by ``struct`` (:meth:`~shoal.frontends.h2.sending.Sender.answer` writes it)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from shoal.frontends.h2 import frames as h2

#: Message lengths whose whole answers are packed in one call (see _AnswerPacks.whole).
_WHOLE_PACKS: Final = 64
#: A message sent whole in one DATA frame (:meth:`~shoal.frontends.h2.sending.Sender.answer`).
Body = bytes | bytearray


class _AnswerPacks:
    """The two packs of a whole answer whose head and trailers have these lengths: what goes
    before the message (HEADERS frame, head, DATA frame header, message prefix) and what goes
    after it (the trailers' HEADERS frame), each one ``struct`` call; and, by the message's
    length, the packs of the whole answer in one call (see :meth:`whole`). A server's answers
    share one head and one trailer block (a unary call's OK), so the last lengths' are kept."""

    __slots__ = ("after", "before", "head", "trailers", "wholes")

    def __init__(self, head: int, trailers: int) -> None:
        self.head = head
        self.trailers = trailers
        self.before: Callable[..., bytes] = struct.Struct(f">HBBBI{head}sHBBBIBI").pack
        self.after: Callable[..., bytes] = struct.Struct(f">HBBBI{trailers}s").pack
        self.wholes: dict[int, Callable[..., bytes]] = {}

    def whole(self, body: int) -> Callable[..., bytes] | None:
        """The pack of a whole answer whose message has ``body`` bytes; None past
        :data:`_WHOLE_PACKS` lengths (a client's answers come in a few sizes)."""
        pack = self.wholes.get(body)
        if pack is None and len(self.wholes) < _WHOLE_PACKS:
            layout = f">HBBBI{self.head}sHBBBIBI{body}sHBBBI{self.trailers}s"
            pack = self.wholes[body] = struct.Struct(layout).pack
        return pack


class _LastPacks:
    """The packs of the last answer's lengths (see :class:`_AnswerPacks`)."""

    def __init__(self) -> None:
        self.packs = _AnswerPacks(0, 0)

    def of(self, head: int, trailers: int) -> _AnswerPacks:
        packs = self.packs
        if packs.head != head or packs.trailers != trailers:
            packs = self.packs = _AnswerPacks(head, trailers)
        return packs


_LAST_PACKS: Final = _LastPacks()


def answer_frames(stream_id: int, head: bytes, body: Body, trailers: bytes) -> bytes:
    """HEADERS ``head``, DATA with the gRPC message ``body`` and HEADERS ``trailers`` ending the
    stream, each one frame, as one piece: two packs and a join of three (three frame headers
    packed apart and a join of six cost ~2,500 instructions more)."""
    head_size, trailers_size, size = len(head), len(trailers), len(body) + 5
    packs = _LAST_PACKS.of(head_size, trailers_size)
    whole = packs.whole(size - 5)
    if whole is not None:
        return whole(
            head_size >> 8,
            head_size & 0xFF,
            h2.HEADERS,
            h2.END_HEADERS,
            stream_id,
            head,
            size >> 8,
            size & 0xFF,
            h2.DATA,
            0,
            stream_id,
            0,
            size - 5,
            body,
            trailers_size >> 8,
            trailers_size & 0xFF,
            h2.HEADERS,
            h2.END_STREAM | h2.END_HEADERS,
            stream_id,
            trailers,
        )
    before = packs.before(
        head_size >> 8,
        head_size & 0xFF,
        h2.HEADERS,
        h2.END_HEADERS,
        stream_id,
        head,
        size >> 8,
        size & 0xFF,
        h2.DATA,
        0,
        stream_id,
        0,
        size - 5,
    )
    after = packs.after(
        trailers_size >> 8,
        trailers_size & 0xFF,
        h2.HEADERS,
        h2.END_STREAM | h2.END_HEADERS,
        stream_id,
        trailers,
    )
    return b"".join((before, body, after))
