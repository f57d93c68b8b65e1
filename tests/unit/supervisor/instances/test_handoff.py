"""The direct hand-off: a request submitted to the default scheduler while an instance is idle
goes to its stub inside ``submit``; a busy instance's requests queue and go in order."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shoal.core.errors import Unavailable
from shoal.supervisor.schedulers.default import DefaultScheduler
from tests.unit.supervisor.instances.helpers import Setup, double, run
from tests.unit.supervisor.schedulers.helpers import WAIT, result, settle

pytestmark = pytest.mark.timeout(10)


async def _started(setup: Setup) -> DefaultScheduler:
    scheduler = DefaultScheduler(lambda work: setup._free(work.input_blocks))
    await setup.instance.start(scheduler)
    await settle()  # the work loop parks with the scheduler
    return scheduler


def test_a_request_reaches_an_idle_instance_inside_submit():
    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        work = s.work(3.0)
        scheduler.submit(work)
        # No await since submit: no future was resolved, no task stepped to send it.
        assert work.dispatched_ns > 0 and s.instance.busy
        assert s.stub.executions == 1 and scheduler.pending == 0
        outputs = await result(work)
        np.testing.assert_array_equal(outputs["Y"], np.full((1, 2), 6.0, np.float32))
        await s.close()
        assert not scheduler._takers  # stopped: no longer parked

    run(scenario())


def test_a_busy_instance_queues_and_its_requests_run_in_order():
    async def scenario():
        seen: list[float] = []
        gate = {"open": False}

        def model(inputs):
            seen.append(float(inputs["X"][0, 0]))
            return double(inputs) if gate["open"] else None  # the first one hangs

        s = Setup(model)
        scheduler = await _started(s)
        held = s.work(0.0)
        scheduler.submit(held)
        queued = [s.work(float(i)) for i in range(1, 5)]
        for work in queued:
            scheduler.submit(work)
        assert s.stub.executions == 0 and seen == [0.0]  # the one slot is taken
        assert scheduler.pending == 4
        s.stub.kill()  # the hung batch fails; the queued ones wait for the next stub
        with pytest.raises(Unavailable):
            await asyncio.wait_for(held.future, WAIT)
        gate["open"] = True
        await s.restarted(2)
        for value, work in enumerate(queued, start=1):
            outputs = await result(work)
            assert outputs["Y"][0, 0] == 2.0 * value
        assert seen == [0.0, 1.0, 2.0, 3.0, 4.0]
        await s.close()

    run(scenario())


def test_requests_sent_ahead_go_at_once_and_the_rest_follow_each_answer():
    async def scenario():
        seen: list[float] = []

        def model(inputs):
            seen.append(float(inputs["X"][0, 0]))
            return double(inputs)

        s = Setup(model, send_ahead=True)
        scheduler = await _started(s)
        works = [s.work(float(i)) for i in range(10)]
        for work in works:
            scheduler.submit(work)
        sent = [w for w in works if w.dispatched_ns]
        assert 1 < len(sent) < len(works)  # the slots' worth went at once
        assert scheduler.pending == len(works) - len(sent)
        for value, work in enumerate(works):
            assert (await result(work))["Y"][0, 0] == 2.0 * value
        assert seen == [float(i) for i in range(10)]
        await s.close()

    run(scenario())


def test_closing_the_scheduler_ends_a_parked_work_loop():
    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        assert scheduler.close() == []
        await settle()
        worker = s.instance._worker
        assert worker is not None and worker.done()
        await s.close()

    run(scenario())


def test_a_request_for_a_stub_not_ready_waits_for_the_next_one():
    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        s.instance._current.ready.clear()  # as between a death and the next stub
        work = s.work(2.0)
        scheduler.submit(work)
        await settle()
        assert not work.dispatched_ns and scheduler.pending == 1  # put back, not lost
        s.instance._current.ready.set()
        assert (await result(work))["Y"][0, 0] == 4.0
        await s.close()

    run(scenario())


def test_an_instance_shared_with_workers_is_held_out_while_its_stub_waits_on_a_call():
    """A frontend worker's request runs there unseen by the core: a request (the stub's own
    BLS call, say) waits in the queue until the stub's calls are answered."""

    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        s.instance.share_with_workers(lambda pid, error: None)
        proc = s.instance.process
        assert proc is not None
        s.instance.call_began(proc)
        s.instance.call_began(proc)  # two calls at once (async_exec)
        assert s.instance.busy and not scheduler._takers
        work = s.work(2.0)
        scheduler.submit(work)
        assert not work.dispatched_ns and scheduler.pending == 1
        s.instance.call_ended(proc)
        assert not work.dispatched_ns  # one call still waits
        s.instance.call_ended(proc)
        assert work.dispatched_ns and scheduler.pending == 0  # taken at once
        assert (await result(work))["Y"][0, 0] == 4.0
        await settle()
        assert scheduler._takers and not s.instance.busy  # parked again
        await s.close()

    run(scenario())


def test_a_stub_that_dies_waiting_on_a_call_leaves_its_instance_taking_requests():
    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        s.instance.share_with_workers(lambda pid, error: None)
        proc = s.instance.process
        assert proc is not None
        s.instance.call_began(proc)
        s.stub.kill()
        await s.restarted(2)
        assert not s.instance.busy
        s.instance.call_ended(proc)  # a late answer to the dead stub's call changes nothing
        work = s.work(1.5)
        scheduler.submit(work)
        assert (await result(work))["Y"][0, 0] == 3.0
        await s.close()

    run(scenario())


def test_an_instance_only_the_core_sends_to_is_not_held_out_by_a_call():
    """Its slots already count what runs there (a sync execute that calls holds its slot)."""

    async def scenario():
        s = Setup()
        scheduler = await _started(s)
        proc = s.instance.process
        assert proc is not None
        s.instance.call_began(proc)
        work = s.work(2.0)
        scheduler.submit(work)
        assert work.dispatched_ns
        assert (await result(work))["Y"][0, 0] == 4.0
        s.instance.call_ended(proc)
        await s.close()

    run(scenario())
