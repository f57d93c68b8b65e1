"""The ModelStreamInfer exchange: many requests in, one answer per request out, as each completes.

Requests are answered concurrently. An answer is written as soon as its request completes, so a
slow request does not hold back the answers of later, quicker ones. The stream ends once the client
has closed its side and every request has been answered. If the stream ends early (the client
cancels, the server stops), every request still running is cancelled.

The module knows nothing of gRPC or protobuf: ``answer`` turns a request message into the bytes
of its response message and reports failures inside those bytes (``error_message``); an exception
out of ``answer`` is a bug, and ends the stream with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable

Answer = Callable[[bytes], Awaitable[bytes]]


async def answer_stream(
    requests: AsyncIterable[bytes], answer: Answer
) -> AsyncGenerator[bytes, None]:
    """Yield the answer of every request of ``requests``, in order of completion."""
    # An answer; None once the client has closed its side; an exception that ends the stream.
    done: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    issued = 0

    async def answer_one(message: bytes) -> None:
        try:
            done.put_nowait(await answer(message))
        except Exception as exc:
            done.put_nowait(exc)

    async def read() -> None:
        nonlocal issued
        try:
            async for message in requests:
                issued += 1
                task = asyncio.create_task(answer_one(message), name="shoal-grpc-stream-infer")
                running.add(task)
                task.add_done_callback(running.discard)
        except Exception as exc:
            done.put_nowait(exc)
        else:
            done.put_nowait(None)

    reader = asyncio.create_task(read(), name="shoal-grpc-stream-reader")
    sent, ended = 0, False
    try:
        while not (ended and sent == issued):
            item = await done.get()
            if item is None:
                ended = True
            elif isinstance(item, Exception):
                raise item
            else:
                sent += 1
                yield item
    finally:
        await _cancel([reader, *running])


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
