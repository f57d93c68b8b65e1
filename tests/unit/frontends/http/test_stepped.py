"""Stepped: a fast request's coroutine run by hand, as a task would run it."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from shoal.frontends._last_step import LAST_STEP
from shoal.frontends.http._fast_request import Stepped

pytestmark = pytest.mark.timeout(30)


def _run(main: Any) -> Any:
    return asyncio.run(main())


def test_the_first_step_runs_at_once_and_the_rest_when_the_future_is_done() -> None:
    events: list[str] = []

    async def work(future: asyncio.Future[int]) -> None:
        events.append("started")
        events.append(f"got {await future}")

    async def main() -> None:
        tasks: set[Any] = set()
        future = asyncio.get_running_loop().create_future()
        stepped = Stepped(work(future), tasks)
        assert events == ["started"] and tasks == {stepped}  # before the loop turned
        future.set_result(7)
        await asyncio.sleep(0)  # the future's callbacks run on the next turn
        assert events == ["started", "got 7"] and not tasks

    _run(main)


def test_a_bare_yield_steps_again_on_the_next_turn() -> None:
    events: list[str] = []

    async def work() -> None:
        await asyncio.sleep(0)
        events.append("after the sleep")

    async def main() -> None:
        tasks: set[Any] = set()
        Stepped(work(), tasks)
        assert events == [] and len(tasks) == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert events == ["after the sleep"] and not tasks

    _run(main)


def test_a_cancel_while_awaiting_is_a_cancelled_error_at_the_await() -> None:
    seen: list[str] = []

    async def work(future: asyncio.Future[None]) -> None:
        try:
            await future
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        tasks: set[Any] = set()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stepped = Stepped(work(future), tasks)
        assert stepped.cancel(msg="shutting down")  # as uvicorn's shutdown calls it
        assert future.cancelled()
        await asyncio.sleep(0)
        assert seen == ["cancelled"] and not tasks

    _run(main)


def test_a_cancel_between_steps_is_thrown_at_the_next() -> None:
    seen: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(0)
            seen.append("not cancelled")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        tasks: set[Any] = set()
        Stepped(work(), tasks).cancel()
        await asyncio.sleep(0)
        assert seen == ["cancelled"] and not tasks

    _run(main)


def test_an_exception_that_ends_it_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def work(future: asyncio.Future[None]) -> None:
        await future
        raise ValueError("boom")

    async def main() -> None:
        tasks: set[Any] = set()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        Stepped(work(future), tasks)
        future.set_result(None)
        await asyncio.sleep(0)
        assert not tasks

    with caplog.at_level(logging.ERROR, logger="shoal.frontends.http"):
        _run(main)
    assert "boom" in caplog.text


def test_a_yield_of_something_else_is_thrown_back_as_a_task_would() -> None:
    seen: list[str] = []

    class Odd:
        def __await__(self) -> Any:
            yield "not a future"

    async def work() -> None:
        try:
            await Odd()
        except RuntimeError as exc:
            seen.append(str(exc))

    async def main() -> None:
        tasks: set[Any] = set()
        Stepped(work(), tasks)
        await asyncio.sleep(0)
        assert len(seen) == 1 and "not a future" in seen[0] and not tasks

    _run(main)


def test_a_finished_one_is_no_reference_cycle() -> None:
    # Freed by its reference count once done: a cycle would be garbage only the collector
    # frees (a collection every few hundred requests).
    async def work(future: asyncio.Future[None]) -> None:
        await future

    async def main() -> None:
        tasks: set[Any] = set()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        Stepped(work(future), tasks)
        future.set_result(None)
        await asyncio.sleep(0)
        assert not tasks

    _assert_no_stepped_garbage(main)


def test_awaiting_the_last_step_ends_it_without_resuming() -> None:
    events: list[str] = []

    async def work(future: asyncio.Future[int]) -> None:
        events.append(f"got {await future}")
        await LAST_STEP
        events.append("resumed")  # never: the step that yields LAST_STEP is its last

    async def main() -> None:
        tasks: set[Any] = set()
        future = asyncio.get_running_loop().create_future()
        stepped = Stepped(work(future), tasks)
        assert tasks == {stepped}
        future.set_result(3)
        await asyncio.sleep(0)
        assert not tasks
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert events == ["got 3"]

    _run(main)


def test_a_last_step_at_once_leaves_no_reference_cycle() -> None:
    async def work() -> None:
        await LAST_STEP

    async def main() -> None:
        tasks: set[Any] = set()
        Stepped(work(), tasks)
        assert not tasks  # ended in its first step

    _assert_no_stepped_garbage(main)


def _assert_no_stepped_garbage(main: Any) -> None:
    """Runs ``main`` with the collector saving what it finds: no Stepped may be among it."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _run(main)
        gc.collect()
        assert not [item for item in gc.garbage if type(item) is Stepped]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
