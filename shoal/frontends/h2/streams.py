"""The state of one HTTP/2 stream, and the handler a stream's frames go to."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol


class StreamHandler(Protocol):
    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        """The payloads of one or more DATA frames, in order, valid only during the call (copy
        what you keep); ``end_stream``: the last one ended the peer's side."""

    def receive_buffer(self, nbytes: int) -> memoryview | None:
        """Where up to ``nbytes`` of the stream's next DATA payload may be read straight into
        (the socket read writes there; at most ``nbytes``, maybe fewer), or None: read them
        into the connection's buffer and hand them on by :meth:`data_received`."""

    def data_placed(self, nbytes: int, end_stream: bool) -> None:
        """``nbytes`` of DATA payload were read into the start of the last
        :meth:`receive_buffer` view; ``end_stream``: they ended the peer's side."""

    def trailers_received(self) -> None:
        """The peer ended its side with a header block (trailers) instead of a DATA frame."""

    def reset(self) -> None:
        """The stream ended abnormally: the peer reset it, or the connection was lost."""

    def mid_message(self) -> bool:
        """Whether part of a request message has arrived and the rest is due."""


class Stream:
    """An open stream: its handler, the peer's window for it and what waits for that window."""

    __slots__ = (
        "handler",
        "on_over",
        "pending",
        "recv_unacked",
        "remote_closed",
        "send_window",
        "waiters",
    )

    def __init__(self, handler: StreamHandler | None, send_window: int) -> None:
        self.handler = handler
        self.send_window = send_window
        # DATA (and a final header block) that did not fit the peer's windows, in order:
        # (kind, payload, end_stream). Made by the first that waits (:meth:`queue`): most
        # streams never wait, and a deque made and freed costs every stream ~850 instructions.
        self.pending: deque[tuple[int, memoryview, bool]] | None = None
        self.recv_unacked = 0
        self.remote_closed = False
        self.waiters: list[asyncio.Future[None]] = []
        #: Called once the stream is over and what it wrote has left (Sender.after_sent).
        self.on_over: list[Callable[[], None]] = []

    def queue(self) -> deque[tuple[int, memoryview, bool]]:
        """What waits for the peer's windows (:attr:`pending`), made if need be."""
        pending = self.pending
        if pending is None:
            pending = self.pending = deque()
        return pending

    def pending_bytes(self) -> int:
        pending = self.pending
        return 0 if pending is None else sum(len(payload) for _, payload, _ in pending)

    def over_callbacks(self) -> list[Callable[[], None]]:
        """The callbacks due once the stream is over, taken (the list is replaced only if
        something is in it: a list made and freed at every stream's end costs ~200)."""
        callbacks = self.on_over
        if callbacks:
            self.on_over = []
        return callbacks

    def wake(self) -> None:
        """Wake the writers waiting for the stream's window (it opened, or the stream ended)."""
        waiters = self.waiters
        if not waiters:
            return  # the usual case: no new list made for none
        self.waiters = []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def reset(self) -> None:
        """The stream ended abnormally: wake its writers, tell its handler."""
        self.wake()
        if self.handler is not None:
            self.handler.reset()


def any_mid_message(streams: dict[int, Stream]) -> bool:
    """Whether a request message of any of ``streams`` has arrived in part, the rest due."""
    return any(
        stream.handler is not None and stream.handler.mid_message() for stream in streams.values()
    )


def forget(streams: dict[int, Stream], blocked: dict[int, None], stream_id: int) -> None:
    """Take a stream out of the connection's table and the sender's blocked ones. Not
    ``dict.pop(stream_id, None)``: compiled, that is a generic method call (~400 instructions,
    two on every stream's end); ``in`` and ``del`` are native."""
    if stream_id in streams:
        del streams[stream_id]  # noqa: RUF051 (not pop: see the docstring)
    if stream_id in blocked:
        del blocked[stream_id]  # noqa: RUF051
