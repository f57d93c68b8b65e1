"""The dynamic batcher while it waits out its queue delay: requests queued behind the wait are
checked against the last cut alone (``_batching.Tail``), and every rule still holds."""

from __future__ import annotations

import asyncio

import pytest

from shoal.core.errors import ShoalError
from shoal.ipc.records import RequestRecord
from shoal.supervisor.promise import Promise, Settled
from shoal.supervisor.schedulers._batching import Tail
from shoal.supervisor.schedulers._queues import Entry
from shoal.supervisor.work import Work

from .helpers import result, settle
from .test_dynamic import Setup, _sizes, _x, run

pytestmark = pytest.mark.timeout(10)

DELAY = "dynamic_batching { max_queue_delay_microseconds: 1000 }"


def test_a_batch_that_fills_up_while_waiting_is_sent_at_once(tmp_path):
    async def scenario():
        s = Setup(tmp_path, DELAY)
        (inst,) = s.instances
        works = [s.submit() for _ in range(7)]
        assert await inst.nothing_pulled()  # 7 of 8: wait for more or for the delay
        works.append(s.submit())
        assert await inst.take() == works
        inst.finish()
        for work in works:
            await result(work)
        await s.close()

    run(scenario())


def test_the_delay_starts_with_the_first_request_after_a_cut(tmp_path):
    async def scenario():
        s = Setup(tmp_path, DELAY)
        (inst,) = s.instances
        first = [s.submit() for _ in range(8)]
        assert await inst.take() == first
        inst.finish()
        for work in first:
            await result(work)
        s.clock.advance_us(5000)  # long after: no delay is running on an empty queue
        assert await inst.nothing_pulled()
        late = [s.submit() for _ in range(3)]
        s.clock.advance_us(999)
        assert await inst.nothing_pulled()
        s.clock.advance_us(1)  # the first late request waited max_queue_delay
        assert await inst.take() == late
        inst.finish()
        for work in late:
            await result(work)
        await s.close()

    run(scenario())


def test_a_request_that_does_not_fit_or_differs_in_shape_ends_the_wait(tmp_path):
    async def scenario():
        s = Setup(tmp_path, DELAY)
        (inst,) = s.instances
        big = [s.submit(_x(rows=3)) for _ in range(3)]  # 9 rows > max_batch_size 8
        assert _sizes(await inst.take()) == [3, 3]
        inst.finish()
        wide = s.submit(_x(cols=3))  # big[2] (2 columns) waits; this one cannot join it
        assert await inst.take() == [big[2]]
        inst.finish()
        s.clock.advance_us(1000)
        assert await inst.take() == [wide]
        inst.finish()
        for work in [*big, wide]:
            await result(work)
        await s.close()

    run(scenario())


def test_requests_queued_while_waiting_time_out(tmp_path):
    async def scenario():
        policy = (
            "default_queue_policy { default_timeout_microseconds: 500 "
            "allow_timeout_override: true }"
        )
        s = Setup(tmp_path, DELAY.replace(" }", " " + policy + " }"))
        (inst,) = s.instances
        early = s.submit()
        assert await inst.nothing_pulled()  # the instance waits for the delay
        s.clock.advance_us(100)
        later = s.submit(timeout_us=50)  # queued behind: its deadline is the closest
        s.clock.advance_us(51)
        await settle()
        with pytest.raises(ShoalError, match="Request timeout expired"):
            await later.future
        assert not early.future.done()
        s.clock.advance_us(350)
        with pytest.raises(ShoalError, match="Request timeout expired"):
            await early.future
        assert await inst.nothing_pulled()
        assert s.scheduler.pending == 0
        await s.close()

    run(scenario())


def test_an_abandoned_request_does_not_count_once_a_cut_looks(tmp_path):
    async def scenario():
        s = Setup(tmp_path, DELAY)
        (inst,) = s.instances
        gone = s.submit()
        kept = [s.submit() for _ in range(6)]
        gone.future.cancel()  # the client went away while queued
        kept.append(s.submit())  # 8 queued, 7 of them live: the cut finds no full batch
        assert await inst.nothing_pulled()
        assert s.scheduler.pending == 7
        kept.append(s.submit())
        assert await inst.take() == kept
        inst.finish()
        for work in kept:
            await result(work)
        await s.close()

    run(scenario())


def test_drain_waits_for_requests_queued_while_waiting(tmp_path):
    async def scenario():
        s = Setup(tmp_path, DELAY)
        (inst,) = s.instances
        assert await inst.nothing_pulled()
        works = [s.submit() for _ in range(2)]
        empty = asyncio.ensure_future(s.scheduler.wait_empty())
        await settle()
        assert not empty.done() and s.scheduler.pending == 2
        s.clock.advance_us(1000)
        assert await inst.take() == works
        await asyncio.wait_for(empty, 1)
        inst.finish()
        for work in works:
            await result(work)
        await s.close()

    run(scenario())


def _entry(size: int, key: object) -> Entry:
    work = Work(RequestRecord("", 0, 0, {}, [], [], 0), [], Promise(Settled()))
    return Entry(work, 0, 0, size, key)


def test_tail_admits_what_leaves_the_batch_short_and_alike():
    tail = Tail(0, None)
    assert tail.admits(_entry(3, "a"), 8)
    assert tail.admits(_entry(4, "a"), 8)
    assert not tail.admits(_entry(1, "a"), 8)  # 8: the batch is full
    assert not tail.admits(_entry(1, "b"), 8)  # another shape
    assert tail.admits(_entry(1, "a"), 9)
    assert tail.size == 8
