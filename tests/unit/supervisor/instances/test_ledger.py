"""The in-flight ledger over loopback stubs: slots, send-ahead, a sent-ahead request's queue
timeout and what a dead stub's batches become."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from shoal.core.errors import Unavailable
from shoal.ipc import messages as msg
from shoal.supervisor.instances.ledger import SEND_AHEAD, Slots
from shoal.supervisor.instances.spec import Flag
from shoal.supervisor.schedulers.dynamic import TIMEOUT_EXPIRED
from tests.unit.supervisor.instances.helpers import Setup, double, run
from tests.unit.supervisor.schedulers.helpers import WAIT, result, settle

pytestmark = pytest.mark.timeout(10)


def _executes(stub) -> list[msg.Execute]:
    return [m for m in stub.received if isinstance(m, msg.Execute)]


def test_slots_are_counted_and_a_release_wakes_the_waiter():
    async def scenario():
        slots = Slots(1)
        assert slots.take()
        assert not slots.take()
        waiting = asyncio.ensure_future(slots.take_when_free())
        await settle()
        assert not waiting.done()
        slots.release()
        await asyncio.wait_for(waiting, WAIT)
        assert not slots.take()  # the waiter took the slot it was woken for

    run(scenario())


def test_a_flag_wakes_its_waiters_once_set_and_forgets_a_cancelled_one():
    async def scenario():
        idle = Flag(True)
        assert idle.is_set()
        await idle.wait()  # idle: returns at once
        idle.clear()
        waiter = asyncio.ensure_future(idle.wait())
        gone = asyncio.ensure_future(idle.wait())
        await settle()
        gone.cancel()
        await settle()
        assert not waiter.done() and gone.cancelled()
        idle.set()
        await asyncio.wait_for(waiter, WAIT)
        assert idle.is_set() and idle._waiters == []

    run(scenario())


def test_a_lone_instance_sends_ahead_and_requeues_what_had_not_started_when_its_stub_dies():
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        s = Setup(model, send_ahead=True)
        await s.instance.start(s.queue)
        works = [s.submit(float(i)) for i in range(SEND_AHEAD + 2)]
        await settle()
        # One executing, SEND_AHEAD waiting in its ring, the last one still in the queue.
        assert len(_executes(s.stub)) == SEND_AHEAD + 1
        hang = False
        s.stub.kill()
        with pytest.raises(Unavailable, match="is not healthy"):
            await asyncio.wait_for(works[0].future, WAIT)
        for value, work in enumerate(works[1:], 1):
            outputs = await result(work)  # rerun on the restarted stub
            np.testing.assert_array_equal(outputs["Y"], np.full((1, 2), 2.0 * value, np.float32))
        await s.close()

    run(scenario())


def test_without_send_ahead_one_batch_at_a_time_reaches_the_stub():
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        s = Setup(model)
        await s.instance.start(s.queue)
        works = [s.submit() for _ in range(3)]
        await settle()
        assert len(_executes(s.stub)) == 1
        assert s.instance.busy
        hang = False
        s.stub.kill()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(works[0].future, WAIT)
        for work in works[1:]:
            await result(work)
        await s.instance.wait_idle()
        await s.close()

    run(scenario())


def test_a_request_sent_ahead_times_out_in_the_ring_and_the_stub_is_told_to_drop_it():
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        s = Setup(model, send_ahead=True)
        await s.instance.start(s.queue)
        running = s.submit()
        ahead = s.work()
        ahead.queue_deadline_ns = time.monotonic_ns() + 50_000_000
        s.queue.put([ahead])
        with pytest.raises(Unavailable, match=TIMEOUT_EXPIRED):
            await asyncio.wait_for(ahead.future, WAIT)
        cancels = [m for m in s.stub.received if isinstance(m, msg.Cancel)]
        assert [ahead.record.key] in [c.keys for c in cancels]
        assert not running.future.done()  # the request executing has no queue timeout
        hang = False
        s.stub.kill()  # the timed-out request goes back and its inputs are freed when it ends
        with pytest.raises(Unavailable):
            await asyncio.wait_for(running.future, WAIT)
        async with asyncio.timeout(WAIT):
            while s.arena.used_bytes:
                await asyncio.sleep(0.005)
        await s.close()

    run(scenario())


def test_the_next_release_calls_on_free_once():
    slots = Slots(1)
    assert slots.take() and not slots.take()
    calls: list[int] = []
    slots.on_free = lambda: calls.append(1)
    slots.release()
    assert calls == [1] and slots.on_free is None  # once: the hand-off registers again
    assert slots.take()
    slots.release()
    assert calls == [1]
