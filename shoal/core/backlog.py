"""A stream's answers that wait for its reader, and when the stream is given up.

A decoupled model may answer faster than its client reads, for a while (a burst of tokens) or
for good (a client with a zero HTTP/2 window holds the memory of every answer the model sends;
one that reads an answer a second, nearly as much). Counting alone cannot tell a client reading
as fast as it can behind a faster model from one that reads nothing. So a stream is given up
when :data:`BACKLOG_MAX` answers wait and its reader took none for :data:`STALL_SECONDS`, or
when :data:`BACKLOG_HARD_MAX` wait whatever it does. The core (the stream of a request) and a
frontend worker (the stream of a call) decide the same way.

A take is the reader's progress at the socket: the frontends take a stream's next answer only
once the bytes of those before it have room to leave (``writable`` of the HTTP/2 stream, the
SSE writer's drain), so the takes stop exactly while the client's window stays shut. A client
that reads steadily but slowly opens its window in bursts: grpc and h2 clients give half a
window back at a time, seconds apart on a slow link or behind a busy application. So the time
allowed without a take is not a second but :data:`STALL_SECONDS`, long enough for those bursts
and short of the connection's send timeout; what a reader that reads nothing holds meanwhile is
bounded by :data:`BACKLOG_HARD_MAX` (docs/decisions.md, "slow stream readers").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final, TypeVar

__all__ = [
    "BACKLOG_HARD_MAX",
    "BACKLOG_MAX",
    "STALL_SECONDS",
    "StreamQueue",
    "stall_message",
    "stalled",
]

#: Answers that may wait before the reader's progress is looked at.
BACKLOG_MAX: Final = 8192
#: How long a reader with :data:`BACKLOG_MAX` answers waiting may take none of them: longer
#: than a slow reader's window stays shut between two bursts (it was 1 s: readers at ~150
#: answers/s were cut after a few thousand answers).
STALL_SECONDS: Final = 10.0
#: Answers that may wait however the reader progresses (a reader slower than the model by
#: 65,536 answers is not one a server can keep up with: ~2 KiB each waits in memory).
BACKLOG_HARD_MAX: Final = 8 * BACKLOG_MAX

_T = TypeVar("_T")


class StreamQueue(asyncio.Queue[_T]):
    """A stream's queue that knows when its reader last took an answer."""

    def __init__(self) -> None:
        super().__init__()
        self.taken_at = time.monotonic()

    def get_nowait(self) -> _T:
        # ``get`` ends here too: every take is seen.
        item = super().get_nowait()
        self.taken_at = time.monotonic()
        return item


def stalled(queue: asyncio.Queue[Any]) -> str | None:
    """Why ``queue``'s stream is given up (for :func:`stall_message`), or None while it is
    not: :data:`BACKLOG_MAX` answers wait and its reader took none for :data:`STALL_SECONDS`,
    or :data:`BACKLOG_HARD_MAX` wait. A plain queue (shoal's own reader, as warmup's) never is."""
    waiting = queue.qsize()
    if waiting < BACKLOG_MAX or not isinstance(queue, StreamQueue):
        return None
    if waiting >= BACKLOG_HARD_MAX:
        return f"(at most {BACKLOG_HARD_MAX} may)"
    if time.monotonic() - queue.taken_at >= STALL_SECONDS:
        return f"(which took none for {STALL_SECONDS:g} s)"
    return None


def stall_message(what: str, cause: str) -> str:
    """The error that ends a stream given up (``what``: "request" or "stream")."""
    return (
        f"too many responses of the {what} wait for the client {cause}: the stream is ended "
        "and the request cancelled"
    )
