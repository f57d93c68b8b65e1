"""The rate limiter's grants: resource pools per device and global, priorities, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from shoal import _serve_flags
from shoal.core.errors import InvalidArgument
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.schedulers.rate_limiter import RateLimiter

pytestmark = pytest.mark.timeout(10)


def _group(*resources: tuple[str, int, bool], priority: int = 0) -> pb.ModelRateLimiter:
    limiter = pb.ModelRateLimiter(priority=priority)
    for name, count, is_global in resources:
        resource = limiter.resources.add(name=name, count=count)
        setattr(resource, "global", is_global)
    return limiter


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_default_copies_are_the_most_any_instance_needs_per_device_or_globally():
    limiter = RateLimiter({})
    limiter.register("a", "a_0", 0, _group(("R1", 4, False), ("G", 2, True)))
    limiter.register("b", "b_0", 0, _group(("R1", 1, False), ("G", 3, True)))
    limiter.register("c", "c_0", 1, _group(("R1", 2, False)))
    assert limiter.capacity(("r1", 0)) == 4
    assert limiter.capacity(("r1", 1)) == 2
    assert limiter.capacity(("g", None)) == 3


def test_flag_counts_per_device_and_for_every_device():
    limiter = RateLimiter({("R1", None): 10, ("R2", 0): 5, ("R2", 1): 8, ("R3", None): 2})
    assert limiter.capacity(("r1", 0)) == limiter.capacity(("r1", 3)) == 10
    assert (limiter.capacity(("r2", 0)), limiter.capacity(("r2", 1))) == (5, 8)
    assert limiter.capacity(("r3", None)) == 2
    with pytest.raises(InvalidArgument) as refused:
        limiter.register("m", "m_0", 0, _group(("R2", 6, False)))
    # Triton's words (its L0_rate_limiter greps for them), then the instance and the pool.
    assert str(refused.value).startswith(
        'Resource count for "r2" is limited to 5 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 6 (instance 'm_0' of model 'm' needs 6 "
        "on device 0"
    )


def test_a_resource_flagged_for_other_devices_only_has_no_copies_here():
    limiter = RateLimiter({("R1", 10): 10, ("G", 0): 1, ("G", 1): 3})
    with pytest.raises(InvalidArgument, match=r'"r1" is limited to 0 .* count is 4'):
        limiter.register("m", "m_0", 0, _group(("R1", 4, False)))
    assert limiter.capacity(("r1", 10)) == 10
    # A global resource has the most any flag gives it, whatever the flag's device (Triton).
    assert limiter.capacity(("g", None)) == 3
    limiter.register("m", "m_0", 0, _group(("G", 3, True)))


def test_one_name_cannot_be_global_and_per_device():
    limiter = RateLimiter({})
    limiter.register("a", "a_0", 0, _group(("R2", 2, True)))
    with pytest.raises(InvalidArgument) as refused:
        limiter.register("b", "b_0", 0, _group(("R1", 1, False), ("R2", 2, False)))
    assert str(refused.value).startswith(
        'Resource "r2" is present as both global and device-specific resource in the model '
        "configuration. (instance 'b_0' of model 'b' declares it per device"
    )
    with pytest.raises(InvalidArgument, match="both global and device-specific"):
        limiter.register("c", "c_0", 0, _group(("R3", 1, False), ("R3", 1, True)))
    # The refused instances took no place: their other resources keep their own counts.
    assert limiter.capacity(("r1", 0)) == 0
    limiter.register("d", "d_0", 0, _group(("R2", 1, True)))


def test_grants_wait_for_resources_and_follow_weighted_counts():
    asyncio.run(_grants())


async def _grants() -> None:
    limiter = RateLimiter({("R", None): 1})
    fast = limiter.register("a", "a_0", 0, _group(("R", 1, False), priority=1))
    slow = limiter.register("b", "b_0", 0, _group(("R", 1, False), priority=2))
    free = limiter.register("c", "c_0", 0, _group())
    grant = await fast.acquire()
    waiting = asyncio.ensure_future(slow.acquire())
    await _settle()
    assert not waiting.done() and limiter.in_use(("r", 0)) == 1
    grant.release()
    grant.release()  # idempotent
    await _settle()
    assert waiting.done() and limiter.in_use(("r", 0)) == 1
    # Both wait now: "a" (1 execution x priority 1) goes before "b" (1 x 2).
    first = asyncio.ensure_future(slow.acquire())
    second = asyncio.ensure_future(fast.acquire())
    await _settle()
    waiting.result().release()
    await _settle()
    assert second.done() and not first.done()
    # An instance that needs nothing and has run least goes at once, R busy or not.
    nothing = asyncio.ensure_future(free.acquire())
    await _settle()
    assert nothing.done() and not first.done()
    second.result().release()
    await _settle()
    assert first.done()
    first.result().release()
    nothing.result().release()
    await _settle()
    assert limiter.in_use(("r", 0)) == 0


def test_a_cancelled_wait_and_a_forgotten_instance_leave_nothing_held():
    asyncio.run(_cancelled())


async def _cancelled() -> None:
    limiter = RateLimiter({})
    a = limiter.register("a", "a_0", 0, _group(("R", 1, False)))
    b = limiter.register("b", "b_0", 0, _group(("R", 1, False)))
    grant = await a.acquire()
    waiting = asyncio.ensure_future(b.acquire())
    await _settle()
    waiting.cancel()
    await _settle()
    grant.release()
    await _settle()
    assert limiter.in_use(("r", 0)) == 0
    grant = await a.acquire()
    pending = asyncio.ensure_future(b.acquire())
    await _settle()
    limiter.forget(b)  # b's model is unloaded while it waits
    await _settle()
    assert pending.cancelled()
    grant.release()
    await _settle()
    assert limiter.in_use(("r", 0)) == 0


def test_rate_limit_resource_flags():
    assert _serve_flags.rate_limit_resources([("r1", 10, None), ("r2", 5, 0)]) == {
        ("r1", None): 10,
        ("r2", 0): 5,
    }
    with pytest.raises(SystemExit, match="given twice"):
        _serve_flags.rate_limit_resources([("r1", 1, 0), ("r1", 2, 0)])
