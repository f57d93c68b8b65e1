"""The dynamic batcher, driven by a manual clock and loopback instances (no sleeps)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shoal.core.errors import ErrorCode, ShoalError
from shoal.supervisor.schedulers import DynamicBatcher, make_scheduler

from .helpers import Arenas, Loopback, ManualClock, load_config, make_work, result, settle

pytestmark = pytest.mark.timeout(10)

BASE = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _x(rows: int = 1, cols: int = 2, value: float = 0.0) -> dict[str, np.ndarray]:
    return {"X": np.full((rows, cols), value, np.float32)}


class Setup:
    def __init__(self, tmp_path, batching: str, instances: int = 1, base: str = BASE) -> None:
        self.clock = ManualClock()
        self.arenas = Arenas()
        config = load_config(tmp_path, base + batching)
        self.scheduler = make_scheduler(
            config, instances, self.arenas.free_work, self.arenas.stage, self.clock
        )
        assert isinstance(self.scheduler, DynamicBatcher)
        self.instances = [Loopback(self.scheduler.source(i), self.arenas) for i in range(instances)]

    def submit(self, inputs=None, **kwargs):
        work = make_work(self.arenas, inputs or _x(), **kwargs)
        self.scheduler.submit(work)
        return work

    async def close(self) -> None:
        for instance in self.instances:
            await instance.stop()
        for work in self.scheduler.close():
            self.arenas.free_work(work)
        assert self.arenas.used == 0, "blocks leaked"
        self.arenas.close()


def run(coro):
    asyncio.run(coro)


def _sizes(batch) -> list[int]:
    return [w.batch_size for w in batch]


def test_preferred_size_is_cut_at_once_and_delay_sends_the_rest(tmp_path):
    async def scenario():
        s = Setup(
            tmp_path,
            "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000 }",
        )
        (inst,) = s.instances
        works = [s.submit() for _ in range(3)]
        assert await inst.nothing_pulled()  # 3 < 4: wait for more or for the delay
        works.append(s.submit())
        assert await inst.take() == works
        inst.finish()
        for work in works:
            await result(work)
        late = [s.submit(), s.submit()]
        s.clock.advance_us(999)
        assert await inst.nothing_pulled()
        s.clock.advance_us(1)  # the oldest has waited max_queue_delay
        assert await inst.take() == late
        inst.finish()
        for work in late:
            await result(work)
        await s.close()

    run(scenario())


def test_no_delay_sends_what_is_queued_when_an_instance_is_free(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { }")
        (inst,) = s.instances
        first = s.submit()
        assert await inst.take() == [first]  # nothing to wait for
        queued = [s.submit(_x(rows=3)) for _ in range(3)]  # 9 rows > max_batch_size 8
        inst.finish()
        batch = await inst.take()
        assert _sizes(batch) == [3, 3]  # the third request does not fit: next batch
        inst.finish()
        assert await inst.take() == [queued[2]]
        inst.finish()
        for work in [first, *queued]:
            await result(work)
        await s.close()

    run(scenario())


def test_requests_with_different_shapes_do_not_share_a_batch(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { }")
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        a, b, c = s.submit(_x(cols=2)), s.submit(_x(cols=3)), s.submit(_x(cols=3))
        inst.finish()
        assert await inst.take() == [a]
        inst.finish()
        assert await inst.take() == [b, c]
        inst.finish()
        for work in (blocker, a, b, c):
            await result(work)
        await s.close()

    run(scenario())


def test_execution_holds_the_outputs_of_every_request(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { }")
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        works = [s.submit(_x(value=float(i))) for i in range(4)]
        inst.finish()
        assert await inst.take() == works
        inst.finish()
        await result(blocker)
        for i, work in enumerate(works):
            np.testing.assert_array_equal((await result(work))["X"], np.full((1, 2), i))
        await s.close()

    run(scenario())


PRIORITIES = """
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  priority_queue_policy { key: 3 value { max_queue_size: 1 } }
}
"""


def test_higher_priority_requests_go_first(tmp_path):
    async def scenario():
        s = Setup(tmp_path, PRIORITIES.replace("max_queue_size: 1", "max_queue_size: 5"))
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        low = s.submit(params={"priority": 3})
        default = s.submit()  # priority 0: the default level 2
        high = s.submit(params={"priority": 1})
        beyond = s.submit(params={"priority": 9})  # above the levels: the default level
        inst.finish()
        assert await inst.take() == [high, default, beyond, low]
        inst.finish()
        for work in (blocker, low, default, high, beyond):
            await result(work)
        await s.close()

    run(scenario())


def test_full_queue_rejects_with_tritons_message(tmp_path):
    async def scenario():
        s = Setup(tmp_path, PRIORITIES)
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        kept = s.submit(params={"priority": 3})
        rejected = s.submit(rid="r7", params={"priority": 3})
        with pytest.raises(ShoalError) as info:
            await rejected.future
        assert info.value.code is ErrorCode.UNAVAILABLE
        assert str(info.value) == "[request id: r7] Exceeds maximum queue size"
        other_level = s.submit()  # the limit is per level
        inst.finish()
        assert await inst.take() == [other_level, kept]
        inst.finish()
        for work in (blocker, kept, other_level):
            await result(work)
        await s.close()

    run(scenario())


def test_queue_timeout_rejects_and_frees_the_request(tmp_path):
    async def scenario():
        s = Setup(
            tmp_path,
            "dynamic_batching { default_queue_policy { default_timeout_microseconds: 100 } }",
        )
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        before = s.arenas.inputs.used_bytes
        waiting = s.submit()
        s.clock.advance_us(100)
        await settle()
        assert not waiting.future.done()  # expires once the clock is past the deadline
        s.clock.advance_us(1)
        with pytest.raises(ShoalError) as info:
            await waiting.future
        assert info.value.code is ErrorCode.UNAVAILABLE
        assert str(info.value) == "Request timeout expired"
        assert s.arenas.inputs.used_bytes == before  # its blocks were freed at once
        inst.finish()
        await result(blocker)
        assert await inst.nothing_pulled()
        await s.close()

    run(scenario())


def test_timeout_override_may_only_shorten_and_delay_moves_requests_back(tmp_path):
    async def scenario():
        policy = (
            "dynamic_batching { default_queue_policy { timeout_action: DELAY "
            "default_timeout_microseconds: 1000 allow_timeout_override: true } }"
        )
        s = Setup(tmp_path, policy)
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        short = s.submit(timeout_us=10)  # shorter than the default: applies
        longer = s.submit(timeout_us=5000)  # longer: the default applies
        fresh = s.submit()
        s.clock.advance_us(11)
        later = s.submit()
        inst.finish()
        # `short` expired and was delayed: it now waits behind the unexpired requests.
        assert await inst.take() == [longer, fresh, later, short]
        inst.finish()
        for work in (blocker, short, longer, fresh, later):
            await result(work)
        await s.close()

    run(scenario())


def test_preserve_ordering_holds_a_later_batch_back(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { preserve_ordering: true }", instances=2)
        a, b = s.instances
        first = s.submit()
        first_requester = first.future  # the instance completes a stand-in future
        batch_a = await a.take()
        second = s.submit()
        second_requester = second.future
        batch_b = await b.take()
        assert (batch_a, batch_b) == ([first], [second])
        b.finish()  # the later batch finishes first
        await settle()
        assert second.future.done() and not second_requester.done()
        a.finish()
        assert (await result(first_requester))["X"].shape == (1, 2)
        await result(second_requester)
        await s.close()

    run(scenario())


def test_abandoned_requests_are_dropped_and_requeued_batches_come_first(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { }")
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        gone, kept = s.submit(), s.submit()
        gone.future.cancel()  # the client went away while queued
        inst.finish()
        assert await inst.take() == [kept]
        later = s.submit()
        inst.give_back()  # as an instance does when its stub died before the send
        assert await inst.take() == [kept]  # the same batch again, before later work
        inst.finish()
        assert await inst.take() == [later]
        assert s.scheduler.pending == 0
        await asyncio.wait_for(s.scheduler.wait_empty(), 1)
        inst.finish()
        for work in (blocker, kept, later):
            await result(work)
        await s.close()

    run(scenario())


def test_close_returns_queued_work_and_stops_the_instances(tmp_path):
    async def scenario():
        s = Setup(tmp_path, "dynamic_batching { max_queue_delay_microseconds: 1000000 }")
        (inst,) = s.instances
        queued = s.submit()
        assert await inst.nothing_pulled()
        assert s.scheduler.close() == [queued]
        s.arenas.free_work(queued)
        with pytest.raises(asyncio.CancelledError):
            await s.scheduler.next_batch()
        late = s.submit()
        with pytest.raises(ShoalError):
            await late.future
        await s.close()

    run(scenario())


def test_non_batching_model_runs_one_request_per_execution(tmp_path):
    async def scenario():
        base = BASE.replace("max_batch_size: 8", "max_batch_size: 0")
        s = Setup(tmp_path, "dynamic_batching { }", base=base)
        (inst,) = s.instances
        blocker = s.submit(_x(rows=2), batched=False)
        await inst.take()
        rest = [s.submit(_x(rows=2), batched=False) for _ in range(2)]
        inst.finish()
        assert await inst.take() == [rest[0]]
        inst.finish()
        assert await inst.take() == [rest[1]]
        inst.finish()
        for work in (blocker, *rest):
            await result(work)
        await s.close()

    run(scenario())


def test_only_levels_with_a_timeout_time_their_requests_out(tmp_path):
    async def scenario():
        policy = (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "default_queue_policy { allow_timeout_override: true } "
            "priority_queue_policy { key: 2 value { default_timeout_microseconds: 100 } } }"
        )
        s = Setup(tmp_path, policy)
        (inst,) = s.instances
        blocker = s.submit()
        await inst.take()
        untimed = s.submit(timeout_us=10)  # its level has no timeout to shorten
        timed = s.submit(params={"priority": 2})
        s.clock.advance_us(101)
        await settle()
        with pytest.raises(ShoalError, match="Request timeout expired"):
            await timed.future
        assert not untimed.future.done()
        inst.finish()
        assert await inst.take() == [untimed]
        inst.finish()
        for work in (blocker, untimed):
            await result(work)
        await s.close()

    run(scenario())
