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


class _Taker:
    """An instance parked with a free slot: records what it is handed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.taken: list[Work] = []
        self.was_closed = False

    def take(self, work: Work) -> None:
        self.taken.append(work)

    def closed(self) -> None:
        self.was_closed = True


def test_a_parked_instance_is_handed_the_next_request_inside_submit():
    async def scenario():
        loop = asyncio.get_running_loop()
        clock = ManualClock()
        scheduler = DefaultScheduler(lambda w: None, clock)
        first, second = _Taker("first"), _Taker("second")
        assert scheduler.park(first) is None and scheduler.park(second) is None
        a, b, c = (_work(loop, x) for x in ("a", "b", "c"))
        a.record.timeout_us = 500
        for work in (a, b, c):
            scheduler.submit(work)
        assert first.taken == [a] and second.taken == [b]  # first parked, first served
        assert a.queue_deadline_ns == clock.now + 500_000  # kept for the stub's ring
        assert scheduler.pending == 1  # nobody parked for c: it queues
        assert scheduler.park(first) is c  # parking again takes the queue's head

    asyncio.run(scenario())


def test_parking_skips_dropped_work_and_requeued_work_goes_to_parked_instances():
    async def scenario():
        loop = asyncio.get_running_loop()
        freed = []
        scheduler = DefaultScheduler(lambda w: freed.append(w.record.request_id))
        a, b = _work(loop, "a"), _work(loop, "bb")
        scheduler.submit(a)
        scheduler.submit(b)
        a.future.cancel()  # its client went away while it was queued
        taker = _Taker("t")
        assert scheduler.park(taker) is b and freed == ["a"]
        assert scheduler.park(taker) is None
        scheduler.requeue([b])  # the instance could not send it
        assert taker.taken == [b] and scheduler.pending == 0

    asyncio.run(scenario())


def test_close_and_unpark_release_parked_instances():
    async def scenario():
        loop = asyncio.get_running_loop()
        scheduler = DefaultScheduler(lambda w: None)
        leaving, staying = _Taker("leaving"), _Taker("staying")
        scheduler.park(leaving)
        scheduler.park(staying)
        scheduler.unpark(leaving)
        work = _work(loop, "x")
        scheduler.submit(work)
        assert leaving.taken == [] and staying.taken == [work]
        scheduler.park(staying)
        scheduler.close()
        assert staying.was_closed and not leaving.was_closed
        late = _Taker("late")
        assert scheduler.park(late) is None and late.was_closed  # closed: not parked

    asyncio.run(scenario())
