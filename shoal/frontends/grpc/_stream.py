"""The ModelStreamInfer exchange: many requests in, their answers out.

A request has one answer, or any number for a decoupled model.

Requests are answered concurrently. As in Triton, the answer of a request to a model that is not
decoupled (``answer`` returns it :class:`InOrder`) is written once those of the earlier such
requests are: a client reads them in the order it sent them. A decoupled model's answers are
written as they come, neither waiting nor waited for. Where ``answer`` does not know yet
whether the model is decoupled, its :class:`InOrder` holds its place until the answer to that
question comes (``decoupled``), and lets it go if it is. The stream ends once the client
has closed its side and every request has been answered. If the stream ends early (the client
cancels, the server stops), every request still running is cancelled.

When ``closing`` is set (the server is stopping), the stream stops reading requests, answers those
it has, and ends: an idle stream does not hold the server's shutdown until its grace period ends.

The module knows nothing of gRPC or protobuf: ``answer`` turns a request message into the bytes
of its response messages and reports failures inside those bytes (``error_message``); an
exception out of ``answer`` is a bug, and ends the stream with it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable

#: Answers waiting to be written past which a decoupled request's next answers are not taken
#: until the writer catches up (a client that does not read: a zero HTTP/2 window). They wait
#: where the core bounds them (``instances/decoupled.py``, ``workers/streams.py``) instead of
#: piling up here.
WAITING_MAX = 64

#: Requests answered in order that a stream holds at most (running, or answered and waiting for
#: an earlier one): past it the stream reads no more requests until the oldest is written, so
#: a slow request cannot make the answers of the quick ones behind it pile up without bound.
IN_ORDER_MAX = 1024


class InOrder:
    """The answers of a request that are written in the order the requests came, after those
    of the earlier requests answered so."""

    __slots__ = ("decoupled", "done", "replies", "source")

    def __init__(
        self,
        source: AsyncIterator[bytes],
        decoupled: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.source = source
        #: Asks whether the request's model is decoupled, when that was not known as the
        #: request was read: its answers are then written as they come, and the later requests'
        #: stop waiting for them.
        self.decoupled = decoupled
        self.replies: list[bytes] = []  # made, waiting for the earlier requests' answers
        self.done = False


#: One answer (an awaitable) or several (an async iterator) for a request message, written as
#: they come; or answers written in the requests' order (:class:`InOrder`).
Answered = Awaitable[bytes] | AsyncIterator[bytes] | InOrder
Answer = Callable[[bytes | bytearray | memoryview], Answered]


async def answer_stream(
    requests: AsyncIterable[bytes], answer: Answer, closing: asyncio.Event | None = None
) -> AsyncGenerator[bytes, None]:
    """Yield the answers of every request of ``requests``: those :class:`InOrder` in the order
    of their requests, the others as they come."""
    stream = _Stream(answer)
    tasks = [asyncio.create_task(stream.read(requests), name="shoal-grpc-stream-reader")]
    if closing is not None:
        tasks.append(asyncio.create_task(stream.close_when(closing, reader=tasks[0])))
    try:
        async for reply in stream.replies():
            yield reply
    finally:
        await _cancel([*tasks, *stream.running])


class _Stream:
    """The requests read, their answers, and when the stream is over."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        # An answer; None once every request is answered and no more will come; an exception
        # that ends the stream. One item per answer: the stream is told of a request's end by
        # the count of running requests, not by a marker item, as each item costs a wake-up.
        self._done: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()
        self.running: set[asyncio.Task[None]] = set()
        self._unanswered = 0
        self._reading = True
        self._room = asyncio.Event()  # clear while WAITING_MAX answers wait
        self._room.set()
        #: The requests answered in order whose answers are not all written, oldest first.
        self._in_order: deque[InOrder] = deque()
        self._order_room = asyncio.Event()  # clear while IN_ORDER_MAX such requests are held

    async def read(self, requests: AsyncIterable[bytes]) -> None:
        try:
            async for message in requests:
                answered = self._answer(message)
                self._unanswered += 1
                if isinstance(answered, InOrder):
                    self._in_order.append(answered)
                task = asyncio.create_task(self._answer_one(answered), name="shoal-grpc-stream")
                self.running.add(task)
                task.add_done_callback(self.running.discard)
                if len(self._in_order) >= IN_ORDER_MAX:
                    self._order_room.clear()
                    await self._order_room.wait()
        except Exception as exc:
            self._done.put_nowait(exc)
        else:
            self._stop_reading()

    async def close_when(self, closing: asyncio.Event, reader: asyncio.Task[None]) -> None:
        await closing.wait()
        reader.cancel()
        self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._end_if_answered()

    def _end_if_answered(self) -> None:
        if not self._reading and self._unanswered == 0:
            self._done.put_nowait(None)

    async def _answer_one(self, answer: Answered) -> None:
        try:
            if isinstance(answer, InOrder):
                if answer.decoupled is not None and await answer.decoupled():
                    self._in_order.remove(answer)
                    self._write_in_order()  # the later requests' answers wait no more for it
                    await self._as_they_come(answer.source)
                else:
                    async for reply in answer.source:
                        answer.replies.append(reply)
            elif inspect.isawaitable(answer):
                self._done.put_nowait(await answer)
            else:
                await self._as_they_come(answer)
        except Exception as exc:
            self._done.put_nowait(exc)
        if isinstance(answer, InOrder):
            answer.done = True
            self._write_in_order()
        self._unanswered -= 1
        self._end_if_answered()

    async def _as_they_come(self, replies: AsyncIterator[bytes]) -> None:
        async for reply in replies:
            self._done.put_nowait(reply)
            if self._done.qsize() >= WAITING_MAX:
                self._room.clear()
                await self._room.wait()

    def _write_in_order(self) -> None:
        """The answers of the oldest requests answered in order, as far as all are made."""
        waiting = self._in_order
        while waiting and waiting[0].done:
            for reply in waiting.popleft().replies:
                self._done.put_nowait(reply)
        if len(waiting) < IN_ORDER_MAX:
            self._order_room.set()

    async def replies(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._done.get()
            if not self._room.is_set() and self._done.qsize() < WAITING_MAX // 2:
                self._room.set()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
