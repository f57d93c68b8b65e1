"""StubInstance over loopback stubs: batches, a stub's death, execute timeouts, crash loops and
stopping, without starting a process."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from shoal.core.errors import DeadlineExceeded, Unavailable
from shoal.ipc import messages as msg
from tests.unit.supervisor.instances.helpers import Setup, double, run
from tests.unit.supervisor.schedulers.helpers import WAIT, result, settle

pytestmark = pytest.mark.timeout(10)


def test_a_batch_runs_and_its_outputs_are_given_back():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        outputs = await result(s.submit(3.0))
        np.testing.assert_array_equal(outputs["Y"], np.full((1, 2), 6.0, np.float32))
        await settle()  # releases go to the stub once per loop turn
        assert s.stub.output_bytes_in_use == 0
        assert s.stub.executions == 1
        await s.close()

    run(scenario())


def test_a_dead_stub_fails_what_it_held_and_the_instance_restarts():
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        s = Setup(model)
        await s.instance.start(s.queue)
        held = s.submit()
        await settle()
        s.stub.kill()
        with pytest.raises(Unavailable, match="Stub process 'm_0' is not healthy"):
            await asyncio.wait_for(held.future, WAIT)
        assert "signal 9 (SIGKILL)" in s.instance.last_exit
        hang = False
        await s.restarted(2)
        assert s.instance.restarts == 1
        await result(s.submit())  # the new stub serves
        await s.close()

    run(scenario())


def test_an_execute_over_its_timeout_fails_with_deadline_exceeded_and_restarts():
    async def scenario():
        s = Setup(lambda inputs: None, execute_timeout=0.05)
        await s.instance.start(s.queue)
        work = s.submit()
        timed_out = re.escape("execute did not finish within 0.05s")
        with pytest.raises(DeadlineExceeded, match=timed_out):
            await asyncio.wait_for(work.future, WAIT)
        await s.restarted(2)
        await s.close()

    run(scenario())


def test_a_crash_loop_stops_the_restarts_and_says_why():
    async def scenario():
        s = Setup(crash_limit=2, crash_window=60.0)
        await s.instance.start(s.queue)
        s.stub.kill()
        await s.restarted(2)
        s.stub.kill()
        async with asyncio.timeout(WAIT):
            while not s.failed:
                await asyncio.sleep(0.005)
        assert s.failed == [s.instance]
        assert "died 2 times within 60s" in (s.instance.failed or "")
        await settle()
        assert len(s.kind.made) == 2  # no third start
        await s.close()

    run(scenario())


def test_stop_finalizes_the_stub():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        stub = s.stub
        await s.close()
        assert any(isinstance(m, msg.Finalize) for m in stub.received)
        assert stub.returncode == 0

    run(scenario())
