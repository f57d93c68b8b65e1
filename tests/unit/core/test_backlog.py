"""When a stream's reader counts as stalled (shoal.core.backlog)."""

from __future__ import annotations

import asyncio

import pytest

from shoal.core.backlog import (
    BACKLOG_HARD_MAX,
    BACKLOG_MAX,
    STALL_SECONDS,
    StreamQueue,
    stall_message,
    stalled,
)

pytestmark = pytest.mark.timeout(30)


def _full() -> StreamQueue[int]:
    queue: StreamQueue[int] = StreamQueue()
    for n in range(BACKLOG_MAX):
        queue.put_nowait(n)
    return queue


def test_a_reader_is_not_stalled_below_the_backlog_however_long_it_waits() -> None:
    queue: StreamQueue[int] = StreamQueue()
    for n in range(BACKLOG_MAX - 1):
        queue.put_nowait(n)
    queue.taken_at -= 10 * STALL_SECONDS  # it took nothing for long
    assert stalled(queue) is None


def test_a_full_backlog_is_stalled_only_once_nothing_was_taken_for_the_stall_time() -> None:
    queue = _full()
    assert stalled(queue) is None  # just made: its reader had no time yet
    queue.taken_at -= STALL_SECONDS
    assert stalled(queue) == f"(which took none for {STALL_SECONDS:g} s)"


def test_any_take_makes_a_full_backlog_live_again() -> None:
    queue = _full()
    queue.put_nowait(-1)
    queue.taken_at -= STALL_SECONDS
    assert queue.get_nowait() == 0
    assert queue.qsize() == BACKLOG_MAX
    assert stalled(queue) is None


def test_an_awaited_get_counts_as_a_take() -> None:
    async def take(queue: StreamQueue[int]) -> int:
        return await queue.get()

    queue = _full()
    queue.taken_at -= STALL_SECONDS
    queue.put_nowait(-1)
    assert asyncio.run(take(queue)) == 0
    assert stalled(queue) is None


def test_a_plain_queue_is_never_stalled() -> None:
    """shoal's own readers (a decoupled warmup) use plain queues."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(BACKLOG_MAX * 2):
        queue.put_nowait(n)
    assert stalled(queue) is None


def test_a_hard_backlog_ends_the_stream_even_of_a_reader_that_takes() -> None:
    """A reader slower than the model by this many answers (one taking an answer a second)."""
    queue: StreamQueue[int] = StreamQueue()
    for n in range(BACKLOG_HARD_MAX - 1):
        queue.put_nowait(n)
    assert stalled(queue) is None
    queue.put_nowait(-1)
    assert stalled(queue) == "(at most 65536 may)"


def test_the_message_says_what_was_waited_for() -> None:
    assert stall_message("stream", "(which took none for 1 s)") == (
        "too many responses of the stream wait for the client (which took none for 1 s): the "
        "stream is ended and the request cancelled"
    )
