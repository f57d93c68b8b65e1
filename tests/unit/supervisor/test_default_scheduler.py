"""The default scheduler: FIFO, one request per batch, abandoned work dropped and freed."""

from __future__ import annotations

import asyncio

import pytest

from shoal.ipc.arena import Block
from shoal.ipc.messages import RequestRecord
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.work import Work

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
