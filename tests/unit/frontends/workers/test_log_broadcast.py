"""An update of the log settings is answered once every other live worker applied it."""

from __future__ import annotations

import asyncio
import functools
import logging

import pytest

from shoal.frontends.workers.log_broadcast import LogBroadcasts

pytestmark = pytest.mark.timeout(30)


def _on_a_loop(test):
    """Run the coroutine test on an event loop of its own (the class under test sets timers)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))

    return run


class _Answers:
    def __init__(self) -> None:
        self.given: list[str] = []

    def of(self, name: str):
        return lambda: self.given.append(name)


@_on_a_loop
async def test_answered_once_every_other_worker_applied():
    updates, answers = LogBroadcasts(), _Answers()
    token = updates.start(0, [0, 1, 2], answers.of("a"))
    updates.applied(0, token)  # the origin's own frame: it applied the answer already
    updates.applied(1, token)
    assert answers.given == []
    updates.applied(2, token)
    assert answers.given == ["a"]
    updates.applied(2, token)  # late or repeated acknowledgements change nothing
    assert answers.given == ["a"]


@_on_a_loop
async def test_answered_at_once_with_no_other_worker():
    updates, answers = LogBroadcasts(), _Answers()
    updates.start(1, [1], answers.of("alone"))
    assert answers.given == ["alone"]


@_on_a_loop
async def test_acknowledgements_count_for_their_own_update_only():
    updates, answers = LogBroadcasts(), _Answers()
    first = updates.start(0, [0, 1], answers.of("first"))
    updates.applied(1, 0)  # the frame every worker is sent at its start
    updates.applied(1, first + 1)  # no such update
    assert answers.given == []
    updates.applied(1, first)
    assert answers.given == ["first"]


@_on_a_loop
async def test_two_updates_at_once_do_not_wait_for_each_other():
    """A worker whose own update waits for its answer cannot acknowledge another."""
    updates, answers = LogBroadcasts(), _Answers()
    first = updates.start(0, [0, 1, 2], answers.of("through 0"))
    second = updates.start(1, [0, 1, 2], answers.of("through 1"))  # 0 is blocked: not waited for
    updates.applied(2, second)
    assert answers.given == ["through 1"]
    updates.applied(1, first)
    assert answers.given == ["through 1"]
    updates.applied(2, first)
    assert answers.given == ["through 1", "through 0"]


@_on_a_loop
async def test_a_worker_that_exits_is_not_waited_for():
    updates, answers = LogBroadcasts(), _Answers()
    updates.start(0, [0, 1, 2], answers.of("a"))
    updates.gone(1)
    assert answers.given == []
    updates.gone(2)
    assert answers.given == ["a"]


@_on_a_loop
async def test_the_origin_exiting_ends_its_update():
    updates, answers = LogBroadcasts(), _Answers()
    token = updates.start(0, [0, 1], answers.of("a"))
    updates.gone(0)
    assert answers.given == ["a"]
    updates.applied(1, token)
    assert answers.given == ["a"]


@_on_a_loop
async def test_a_stuck_worker_is_waited_for_a_while_then_named(caplog):
    updates, answers = LogBroadcasts(timeout=0.05), _Answers()
    updates.start(0, [0, 3], answers.of("late"))
    with caplog.at_level(logging.WARNING, logger="shoal"):
        for _ in range(200):
            if answers.given:
                break
            await asyncio.sleep(0.01)  # the timer under test runs on this loop
    assert answers.given == ["late"]
    assert "frontend worker(s) 3 did not apply the new log settings within 0.05 s" in caplog.text
