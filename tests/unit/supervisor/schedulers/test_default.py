"""The default scheduler: FIFO, one request per batch, abandoned and expired work dropped and
freed."""

from __future__ import annotations

import asyncio

import pytest

from shoal.core.errors import Unavailable
from shoal.ipc.arena import Block
from shoal.ipc.records import RequestRecord
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.work import Work
from tests.unit.supervisor.schedulers.helpers import ManualClock

pytestmark = pytest.mark.timeout(10)


def _work(loop, rid):
    record = RequestRecord(rid, 0, 0, {}, [], [])
    return Work(record, [Block(0, 0, 64 * len(rid), 64)], loop.create_future())


def test_fifo_and_abandoned_work():
    async def scenario():
        loop = asyncio.get_running_loop()
        freed = []
        scheduler = DefaultScheduler(lambda w: freed.append(w.record.request_id))
        a, b, c = (_work(loop, x) for x in ("a", "bb", "ccc"))
        for w in (a, b, c):
            scheduler.submit(w)
        b.future.cancel()  # the client of b went away before dispatch
        first = await scheduler.next_batch()
        second = await scheduler.next_batch()
        assert [w.record.request_id for w in first + second] == ["a", "ccc"]
        assert freed == ["bb"]
        scheduler.requeue(second)
        assert (await scheduler.next_batch())[0] is c

    asyncio.run(scenario())


def test_waiting_worker_is_woken_and_close_returns_queue():
    async def scenario():
        loop = asyncio.get_running_loop()
        scheduler = DefaultScheduler(lambda w: None)
        waiter = asyncio.create_task(scheduler.next_batch())
        await asyncio.sleep(0)
        work = _work(loop, "x")
        scheduler.submit(work)
        assert (await waiter) == [work]
        scheduler.submit(_work(loop, "y"))
        left = scheduler.close()
        assert [w.record.request_id for w in left] == ["y"]
        with pytest.raises(asyncio.CancelledError):
            await scheduler.next_batch()

    asyncio.run(scenario())


def _timed_work(loop, rid, timeout_us):
    record = RequestRecord(rid, 0, 0, {}, [], [], timeout_us=timeout_us)
    return Work(record, [Block(0, 0, 0, 64)], loop.create_future())


def test_timeout_fails_a_queued_request_on_its_timer():
    async def scenario():
        loop = asyncio.get_running_loop()
        clock = ManualClock()
        freed = []
        scheduler = DefaultScheduler(lambda w: freed.append(w.record.request_id), clock)
        short, untimed, long = (
            _timed_work(loop, "short", 100),
            _timed_work(loop, "untimed", 0),
            _timed_work(loop, "long", 10_000),
        )
        for w in (short, untimed, long):
            scheduler.submit(w)
        clock.advance_us(100)  # at the deadline: not yet expired
        assert not short.future.done()
        clock.advance_us(1)
        with pytest.raises(Unavailable, match=r"^Request timeout expired$"):
            short.future.result()
        assert freed == ["short"] and scheduler.pending == 2
        assert await scheduler.next_batch() == [untimed]
        assert await scheduler.next_batch() == [long]  # handed out in time
        clock.advance_us(20_000)  # its timer was cancelled: it runs, not interrupted
        assert not long.future.done() and freed == ["short"]

    asyncio.run(scenario())


def test_expired_request_is_not_handed_out_even_if_its_timer_is_late():
    async def scenario():
        loop = asyncio.get_running_loop()
        clock = ManualClock()
        scheduler = DefaultScheduler(lambda w: None, clock)
        late, fine = _timed_work(loop, "late", 50), _timed_work(loop, "fine", 0)
        scheduler.submit(late)
        scheduler.submit(fine)
        clock.now += 60_000  # time passes, the timer has not run yet
        assert await scheduler.next_batch() == [fine]
        assert isinstance(late.future.exception(), Unavailable)
        assert scheduler.close() == []

    asyncio.run(scenario())


def test_take_queued_empties_the_queue_and_keeps_it_open():
    """What an outage fails (no instance can run it) leaves the queue; later work queues."""

    async def scenario():
        loop = asyncio.get_running_loop()
        scheduler = DefaultScheduler(lambda w: None, ManualClock())
        scheduler.submit(_work(loop, "t"))
        scheduler.submit(_work(loop, "u"))
        taken = scheduler.take_queued()
        assert [w.record.request_id for w in taken] == ["t", "u"]
        assert scheduler.pending == 0
        await scheduler.wait_empty()
        later = _work(loop, "v")
        scheduler.submit(later)
        assert await scheduler.next_batch() == [later]

    asyncio.run(scenario())
