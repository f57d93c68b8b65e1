"""ModelStreamInfer through ``tritonclient.grpc``'s stream API, and the stream logic on its own."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from shoal.frontends.grpc import _stream as stream_module
from shoal.frontends.grpc._stream import InOrder, answer_stream
from shoal.frontends.grpc.aio import GrpcServer
from tests.stream_cancel import stop_stream_cancelling
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import (
    GATED,
    FullCore,
    client_of,
    failure_message,
    serving,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def stream_core() -> FullCore:
    return FullCore()


@pytest.fixture(scope="module")
def stream_url(loop_thread: LoopThread, stream_core: FullCore) -> Iterator[str]:
    with serving(loop_thread, stream_core) as url:
        yield url


@pytest.fixture
def streaming(
    stream_url: str, stream_core: FullCore, loop_thread: LoopThread
) -> Iterator[tuple[Any, queue.Queue[tuple[Any, Any]]]]:
    """A client with an open stream, and the queue its callback fills with (result, error)."""
    stream_core.__init__()  # type: ignore[misc]
    stream_core.gate = loop_thread.run(_new_event())
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with client_of(stream_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            yield client, results
        finally:
            loop_thread.call(stream_core.gate.set)
            client.stop_stream()


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


def _input(values: list[int]) -> Any:
    tensor = grpcclient.InferInput("X", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


def _next(results: queue.Queue[tuple[Any, Any]]) -> tuple[Any, Any]:
    return results.get(timeout=10)


def test_every_request_gets_its_response(streaming: Any, stream_core: FullCore) -> None:
    client, results = streaming
    for index in range(20):
        client.async_stream_infer("echo", [_input([index])], request_id=f"r{index}")
    answers = {}
    for _ in range(20):
        result, error = _next(results)
        assert error is None
        response = result.get_response()
        answers[response.id] = result.as_numpy("X").tolist()
    assert answers == {f"r{index}": [index] for index in range(20)}
    assert stream_core.released == stream_core.issued == 20


def test_a_failed_request_is_reported_and_the_stream_goes_on(streaming: Any) -> None:
    client, results = streaming
    client.async_stream_infer("fail_unavailable", [_input([1])], request_id="bad")
    result, error = _next(results)
    assert result is None
    assert error.message() == failure_message("fail_unavailable")
    client.async_stream_infer("missing", [_input([1])])
    assert "'missing' is not found" in _next(results)[1].message()
    client.async_stream_infer("crash", [_input([1])])
    assert _next(results)[1].message() == (
        "internal error while serving a streaming inference request; see the server log"
    )
    client.async_stream_infer("echo", [_input([5])], request_id="good")
    result, error = _next(results)
    assert error is None and result.get_response().id == "good"


def test_answers_come_in_the_order_of_their_requests(
    streaming: Any, stream_core: FullCore, loop_thread: LoopThread
) -> None:
    # As Triton writes a stream's answers of models that are not decoupled: a quick request's
    # answer waits for the slow one sent before it.
    client, results = streaming
    client.async_stream_infer(GATED, [_input([1])], request_id="slow")
    client.async_stream_infer("echo", [_input([2])], request_id="quick")
    deadline = time.monotonic() + 10
    while stream_core.issued < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the core double for the quick request's answer
    assert stream_core.issued == 1
    assert results.empty()
    assert stream_core.gate is not None
    loop_thread.call(stream_core.gate.set)
    assert [_next(results)[0].get_response().id for _ in range(2)] == ["slow", "quick"]


def test_every_stream_response_says_whether_it_is_the_last(streaming: Any) -> None:
    # As Triton 2.51 sends it: with or without enable_empty_final_response.
    client, results = streaming
    for flag in (True, False):
        client.async_stream_infer("echo", [_input([1])], enable_empty_final_response=flag)
        response = _next(results)[0].get_response(as_json=True)
        assert response["parameters"]["triton_final_response"] == {"bool_param": True}


def test_closing_the_stream_cancels_running_requests(
    stream_url: str, stream_core: FullCore, loop_thread: LoopThread
) -> None:
    stream_core.__init__()  # type: ignore[misc]
    stream_core.gate = loop_thread.run(_new_event())
    with client_of(stream_url) as client:
        client.start_stream(callback=lambda result, error: None)
        client.async_stream_infer(GATED, [_input([1])])
        _wait_for(lambda: len(stream_core.requests) == 1)
        stop_stream_cancelling(client)
    _wait_for(lambda: stream_core.cancelled == 1)
    assert stream_core.issued == 0


def test_stopping_the_server_ends_an_idle_stream_at_once(loop_thread: LoopThread) -> None:
    server = GrpcServer(FullCore())
    port = loop_thread.run(server.start("127.0.0.1", 0))
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with client_of(f"127.0.0.1:{port}") as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("echo", [_input([1])])
        assert _next(results)[1] is None
        loop_thread.run(server.stop(grace=60), timeout=10)  # not held for the 60 s of grace
        client.stop_stream()
    assert results.empty()


def test_stopping_the_server_answers_the_running_requests_of_a_stream(
    loop_thread: LoopThread,
) -> None:
    core = FullCore()
    core.gate = loop_thread.run(_new_event())
    server = GrpcServer(core)
    port = loop_thread.run(server.start("127.0.0.1", 0))
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with client_of(f"127.0.0.1:{port}") as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(GATED, [_input([3])], request_id="running")
        _wait_for(lambda: len(core.requests) == 1)
        stopping = loop_thread.submit(server.stop(grace=60))
        loop_thread.call(core.gate.set)
        result, error = _next(results)
        assert error is None and result.get_response().id == "running"
        stopping.result(10)
        client.stop_stream()
    assert core.released == core.issued == 1


def _wait_for(condition: Any, timeout: float = 10) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)  # polling a condition set by another thread, not waiting on time


# --- the stream logic without gRPC ------------------------------------------------------------


async def _messages(*items: bytes, fail: Exception | None = None) -> AsyncIterator[bytes]:
    for item in items:
        yield item
    if fail is not None:
        raise fail


def _collect(requests: AsyncIterator[bytes], answer: Any) -> list[bytes]:
    async def run() -> list[bytes]:
        return [reply async for reply in answer_stream(requests, answer)]

    return asyncio.run(run())


def test_answers_come_in_order_of_completion() -> None:
    async def run() -> None:
        gates = {message: asyncio.Event() for message in (b"3", b"1", b"2")}

        async def answer(message: bytes) -> bytes:
            await gates[message].wait()
            return b"re:" + message

        replies = answer_stream(_messages(b"3", b"1", b"2"), answer)
        for message in (b"1", b"2", b"3"):
            gates[message].set()
            assert await anext(replies) == b"re:" + message
        assert await anext(replies, None) is None

    asyncio.run(run())


def test_in_order_answers_wait_for_the_earlier_ones_and_the_others_do_not() -> None:
    async def run() -> None:
        gates = {message: asyncio.Event() for message in (b"a", b"b", b"free")}

        async def replies(message: bytes) -> AsyncIterator[bytes]:
            await gates[message].wait()
            yield b"re:" + message

        def answer(message: bytes) -> AsyncIterator[bytes] | InOrder:
            return replies(message) if message == b"free" else InOrder(replies(message))

        stream = answer_stream(_messages(b"a", b"b", b"free"), answer)
        gates[b"b"].set()
        gates[b"free"].set()
        assert await anext(stream) == b"re:free"  # (b's answer waits for a's)
        gates[b"a"].set()
        assert [await anext(stream), await anext(stream)] == [b"re:a", b"re:b"]
        assert await anext(stream, None) is None

    asyncio.run(run())


def test_a_request_found_decoupled_only_later_lets_the_later_ones_go() -> None:
    """``a``'s model is asked about (a worker asks the core) while ``b`` waits in order behind
    it: found decoupled, ``a`` stops holding ``b`` back, and its own answers are written as
    they come, before it ends; found not decoupled, ``c`` is held in order as any other."""

    async def run() -> None:
        told = {message: asyncio.Event() for message in (b"a", b"c")}
        gates = {message: asyncio.Event() for message in (b"a", b"b", b"c", b"d")}

        async def replies(message: bytes) -> AsyncIterator[bytes]:
            yield b"re:" + message
            await gates[message].wait()
            yield b"end:" + message

        def answer(message: bytes) -> InOrder:
            if message not in told:
                return InOrder(replies(message))

            async def decoupled() -> bool:
                await told[message].wait()
                return message == b"a"

            return InOrder(replies(message), decoupled)

        stream = answer_stream(_messages(b"a", b"b", b"c", b"d"), answer)
        gates[b"b"].set()
        told[b"a"].set()
        assert [await anext(stream) for _ in range(3)] == [b"re:a", b"re:b", b"end:b"]
        gates[b"d"].set()
        told[b"c"].set()
        gates[b"c"].set()
        assert [await anext(stream) for _ in range(4)] == [
            b"re:c",
            b"end:c",
            b"re:d",
            b"end:d",
        ]
        gates[b"a"].set()
        assert await anext(stream) == b"end:a"
        assert await anext(stream, None) is None

    asyncio.run(run())


def test_a_slow_in_order_request_stops_the_reading_past_in_order_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_module, "IN_ORDER_MAX", 3)

    async def run() -> None:
        head = asyncio.Event()
        read = 0

        async def requests() -> AsyncIterator[bytes]:
            nonlocal read
            for index in range(10):
                read += 1
                yield b"slow" if index == 0 else b"quick"

        async def replies(message: bytes) -> AsyncIterator[bytes]:
            if message == b"slow":
                await head.wait()
            yield message

        stream = answer_stream(requests(), lambda message: InOrder(replies(message)))
        waiting = asyncio.ensure_future(anext(stream))
        for _ in range(20):
            await asyncio.sleep(0)  # (turns of the loop: the reader and the answers run)
        assert read == 3 and not waiting.done()
        head.set()
        assert [await waiting] + [await anext(stream) for _ in range(9)] == [b"slow"] + [
            b"quick"
        ] * 9
        assert read == 10 and await anext(stream, None) is None

    asyncio.run(run())


def test_an_empty_stream_ends_at_once() -> None:
    async def answer(message: bytes) -> bytes:
        raise AssertionError("no request to answer")

    assert _collect(_messages(), answer) == []


def test_a_bug_in_answer_ends_the_stream_with_it() -> None:
    async def answer(message: bytes) -> bytes:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        _collect(_messages(b"x"), answer)


def test_closing_stops_reading_and_ends_once_the_running_requests_are_answered() -> None:
    async def run() -> list[bytes]:
        closing, gate = asyncio.Event(), asyncio.Event()
        read: list[bytes] = []

        async def requests() -> AsyncIterator[bytes]:
            yield b"first"
            await asyncio.Event().wait()  # the client keeps its side open, sending nothing
            yield b"never"

        async def answer(message: bytes) -> bytes:
            read.append(message)
            closing.set()
            await gate.wait()
            return b"re:" + message

        replies = answer_stream(requests(), answer, closing)
        waiting = asyncio.ensure_future(anext(replies))
        await closing.wait()
        gate.set()
        answers = [await waiting] + [reply async for reply in replies]
        assert read == [b"first"]
        return answers

    assert asyncio.run(run()) == [b"re:first"]


def test_a_broken_request_stream_ends_the_stream_and_cancels_the_rest() -> None:
    cancelled: list[bytes] = []

    async def answer(message: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(message)
            raise
        return message

    with pytest.raises(ConnectionError):
        _collect(_messages(b"a", b"b", fail=ConnectionError("client went away")), answer)
    assert sorted(cancelled) == [b"a", b"b"]
