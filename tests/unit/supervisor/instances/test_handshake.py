"""The stub's replies to the instance's lifecycle calls, over loopback stubs: the model's
``is_ready()`` (the loopback never answers it) and a stub dying while it is asked."""

from __future__ import annotations

import asyncio

import pytest

from shoal.ipc import messages as msg
from tests.unit.supervisor.instances.helpers import Setup, run
from tests.unit.supervisor.schedulers.helpers import WAIT, settle

pytestmark = pytest.mark.timeout(10)


def test_an_instance_not_started_is_not_ready_and_asks_nothing():
    async def scenario():
        s = Setup()
        assert await s.instance.ask_is_ready(timeout=WAIT) is False
        assert not s.kind.made
        await s.close()

    run(scenario())


def test_is_ready_that_does_not_answer_in_time_says_not_ready():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        assert s.instance.user_ready is False  # the loopback's Ready says so
        assert await s.instance.ask_is_ready(timeout=0.05) is False
        await s.close()

    run(scenario())


def test_callers_join_one_check_and_a_stub_that_dies_answers_it_at_once():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        asking = [asyncio.ensure_future(s.instance.ask_is_ready(timeout=WAIT)) for _ in range(2)]
        await settle()
        checks = [m for m in s.stub.received if isinstance(m, msg.ReadinessCheck)]
        assert len(checks) == 1
        s.stub.kill()
        answers = await asyncio.wait_for(asyncio.gather(*asking), WAIT / 2)
        assert answers == [False, False]
        await s.restarted(2)
        await s.close()

    run(scenario())
