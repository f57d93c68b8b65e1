"""A stepped call (ModelInfer's work, stepped by hand) whose work lets an exception out, past
the handlers a call's own work has: a bug (any Exception) or a CancelledError. The call must
still end as a task-run call does: out of the server's running calls, a stop waiting for it
told, its stream answered (INTERNAL for a bug; a cancelled call's status), nothing held.

The server, its connection, the call (a real NativeCall, opened by the client's HEADERS and
holding its request message) and the client's frames are real; only the work it steps is
the test's, begun where the call would begin its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hyperframe.frame import DataFrame, HeadersFrame

from shoal.frontends.grpc.native import NativeGrpcServer
from shoal.frontends.grpc.native_call import NativeCall
from tests.h2client import RawClient, grpc_frame, request_headers
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore
from tests.unit.frontends.grpc.test_native import echo_request

pytestmark = pytest.mark.timeout(30)


@contextmanager
def open_call(thread: LoopThread) -> Iterator[tuple[NativeGrpcServer, NativeCall, RawClient]]:
    """A ModelInfer call on stream 1 whose request message has come but not the request's
    end (so its own work has not begun): the call, its server and the client."""
    server = NativeGrpcServer(FullCore())  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    try:
        with RawClient(port, timeout=5) as raw:
            raw.send(
                HeadersFrame(1, data=raw.block(request_headers(port)), flags=["END_HEADERS"]),
                DataFrame(1, data=grpc_frame(echo_request(16))),
            )
            raw.ping(b"received")
            (connection,) = server._connections
            call = connection._streams[1].handler
            assert isinstance(call, NativeCall) and call._held > 0  # it holds its request
            yield server, call, raw
    finally:
        thread.run(server.stop(None))


async def _step_and_stop(
    server: NativeGrpcServer, call: NativeCall, work: Coroutine[Any, Any, None]
) -> bool:
    """Begin ``work`` as the call begins its own, then stop the server's calls (its work is
    cancelled) and wait for them; whether the wait ended."""
    server._calls.running.add(call)
    call._begin_work(work)
    await asyncio.sleep(0)
    try:
        await asyncio.wait_for(server._cancel_calls(), 5)
    except TimeoutError:
        return False
    return True


async def _waits_then(outcome: BaseException) -> None:
    """Work that waits until cancelled, then lets ``outcome`` out."""
    try:
        await asyncio.get_running_loop().create_future()
    except asyncio.CancelledError:
        raise outcome from None


@pytest.mark.parametrize(
    ("outcome", "status", "message"),
    [
        (ValueError("a bug"), "13", "unexpected ValueError ending the call"),
        (asyncio.CancelledError(), "1", "the server is shutting down"),
    ],
    ids=["exception", "cancelled"],
)
def test_work_that_lets_an_exception_out_still_ends_the_call(
    loop_thread: LoopThread,
    caplog: pytest.LogCaptureFixture,
    outcome: BaseException,
    status: str,
    message: str,
) -> None:
    with open_call(loop_thread) as (server, call, raw):
        with caplog.at_level(logging.ERROR):
            assert loop_thread.run(_step_and_stop(server, call, _waits_then(outcome)))
        response = raw.read_stream(1)
        assert (response.status, response.message) == (status, message)
        assert not server._calls.running and not call._working()
        assert call._held == 0 and call._request is None
        (budget,) = server._budgets.values()
        assert budget.held == 0
        assert ("a bug" in caplog.text) == (status == "13")
        raw.ping(b"serve on")


def test_work_that_raises_in_its_first_step_ends_the_call(loop_thread: LoopThread) -> None:
    """A bug at once, before any await: answered INTERNAL, out of the running calls."""

    async def broken() -> None:
        raise RuntimeError("at once")

    with open_call(loop_thread) as (server, call, raw):

        async def begin() -> None:
            server._calls.running.add(call)
            call._begin_work(broken())

        loop_thread.run(begin())
        response = raw.read_stream(1)
        assert (response.status, response.message) == (
            "13",
            "unexpected RuntimeError ending the call",
        )
        assert not server._calls.running and call._held == 0


@pytest.mark.parametrize(
    ("outcome", "expired"),
    [
        (ValueError("late bug"), False),
        (asyncio.CancelledError(), False),
        (asyncio.CancelledError(), True),
    ],
    ids=["exception", "cancelled", "cancelled-past-its-deadline"],
)
def test_work_that_answered_then_raises_is_not_answered_again(
    loop_thread: LoopThread, outcome: BaseException, expired: bool
) -> None:
    """The work answered, then let an exception out (from a ``finally``, say): the client has
    its one status, and no second block follows it (a deadline's status is forced past the
    check that the call was answered)."""
    with open_call(loop_thread) as (server, call, raw):

        async def work() -> None:
            call._finish(0, "")
            call._expired = expired
            await asyncio.sleep(0)
            raise outcome

        async def begin() -> None:
            server._calls.running.add(call)
            call._begin_work(work())
            await asyncio.sleep(0.05)

        loop_thread.run(begin())
        response = raw.read_stream(1)
        assert response.status == "0"
        # (an RST_STREAM NO_ERROR may follow: the client never ended its side)
        frames = raw.ping(b"serve on")
        after = [f for f in frames if f.stream_id == 1 and isinstance(f, HeadersFrame | DataFrame)]
        assert after == []
        assert not server._calls.running and call._held == 0
