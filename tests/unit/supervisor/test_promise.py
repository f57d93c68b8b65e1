"""A Promise answers as an asyncio.Future does (the same script gives the same trace on both),
and calls back every promise settled in a loop turn from one call_soon."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shoal.supervisor.promise import Promise, Settled

pytestmark = pytest.mark.timeout(10)

Script = Callable[[Any, list[str]], None]


def _describe(outcome: Any) -> str:
    """What a Future's (or a Promise's) accessors say, as text."""
    if not outcome.done():
        try:
            outcome.result()
        except asyncio.InvalidStateError:
            return "pending"
        return "pending but has a result"
    if outcome.cancelled():
        for read in (outcome.result, outcome.exception):
            with pytest.raises(asyncio.CancelledError):
                read()
        return "cancelled"
    error = outcome.exception()
    if error is not None:
        with pytest.raises(type(error)):
            outcome.result()
        return f"error {error!r}"
    return f"result {outcome.result()!r}"


async def _trace(make: Callable[[], Any], script: Script) -> list[str]:
    """Run ``script`` on a fresh outcome, then let the loop turn twice: the trace of events."""
    events: list[str] = []
    outcome = make()
    script(outcome, events)
    events.append("script done")
    for _ in range(3):
        await asyncio.sleep(0)
    events.append(_describe(outcome))
    return events


def _callback(events: list[str], name: str) -> Callable[[Any], None]:
    return lambda outcome: events.append(f"{name}: {_describe(outcome)}")


def _result_then_late_callback(outcome: Any, events: list[str]) -> None:
    outcome.add_done_callback(_callback(events, "a"))
    outcome.add_done_callback(_callback(events, "b"))
    outcome.set_result(7)
    events.append("set")
    outcome.add_done_callback(_callback(events, "late"))


def _error(outcome: Any, events: list[str]) -> None:
    outcome.add_done_callback(_callback(events, "a"))
    outcome.set_exception(ValueError("no"))
    with pytest.raises(asyncio.InvalidStateError):
        outcome.set_result(1)


def _cancel_twice(outcome: Any, events: list[str]) -> None:
    outcome.add_done_callback(_callback(events, "a"))
    events.append(f"first cancel {outcome.cancel()}")
    events.append(f"second cancel {outcome.cancel()}")
    with pytest.raises(asyncio.InvalidStateError):
        outcome.set_exception(ValueError("late"))


def _pending(outcome: Any, events: list[str]) -> None:
    outcome.add_done_callback(_callback(events, "never"))
    with pytest.raises(asyncio.InvalidStateError):
        outcome.exception()


def _callback_adds_callback(outcome: Any, events: list[str]) -> None:
    def first(done: Any) -> None:
        events.append("first")
        done.add_done_callback(_callback(events, "added by first"))

    outcome.add_done_callback(first)
    outcome.set_result("x")


@pytest.mark.parametrize(
    "script", [_result_then_late_callback, _error, _cancel_twice, _pending, _callback_adds_callback]
)
def test_a_promise_answers_as_a_future(script: Script) -> None:
    async def both() -> tuple[list[str], list[str]]:
        loop = asyncio.get_running_loop()
        settled = Settled(loop)
        return await _trace(loop.create_future, script), await _trace(
            lambda: Promise(settled), script
        )

    future, promise = asyncio.run(both())
    assert promise == future


def test_callbacks_run_on_a_later_turn_in_the_order_promises_settled() -> None:
    asyncio.run(_in_settling_order())


async def _in_settling_order() -> None:
    settled = Settled(asyncio.get_running_loop())
    events: list[str] = []
    promises = [Promise(settled) for _ in range(3)]
    for index, promise in enumerate(promises):
        promise.add_done_callback(lambda p, index=index: events.append(f"{index}: {p.result()}"))
    for index in (2, 0, 1):
        promises[index].set_result(index * 10)
    assert events == []  # not called back inside set_result
    await asyncio.sleep(0)
    assert events == ["2: 20", "0: 0", "1: 10"]


def test_a_failing_callback_is_reported_and_the_others_still_run() -> None:
    asyncio.run(_failing_callback())


async def _failing_callback() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        settled = Settled(loop)
        first, second = Promise(settled), Promise(settled)
        ran: list[str] = []

        def boom(_: Any) -> None:
            raise RuntimeError("bug in a callback")

        first.add_done_callback(boom)
        first.add_done_callback(lambda _: ran.append("first's second callback"))
        second.add_done_callback(lambda _: ran.append("second"))
        first.set_result(1)
        second.set_result(2)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ran == ["first's second callback", "second"]
    assert [str(context["exception"]) for context in reported] == ["bug in a callback"]
