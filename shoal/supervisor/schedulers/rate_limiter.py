"""The rate limiter (``--rate-limit execution_count``), as Triton documents it.

Each instance lists the resources one execution needs (``instance_group.rate_limiter.resources``:
per-device copies, or ``global: true`` for one pool across devices) and a ``priority``. An
instance with a batch in hand asks for an execution; the limiter grants waiting instances in the
order of their execution count times their priority (an instance with priority 2 gets half the
turns of one with priority 1; 0 counts as 1), earliest request first among equals, while the
resources of the one at the head are free; a grant holds the resources until the batch is
answered or fails. A head whose resources are busy holds the others back, so a big consumer is
not starved by small ones.

Copies of a resource: ``--rate-limit-resource <name>:<count>[:<device>]`` (a device-less count
applies to every device; a resource named only for other devices has none on this one), else the
most any registered instance asks for, so every instance can run. A flag that leaves fewer copies
than an instance needs fails that model's load, and so does a name declared global by one
instance and per device by another.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.core.errors import InvalidArgument

#: ``(name, device)``; ``device`` is None for a global resource (and for a flag's count that
#: applies to every device).
PoolKey = tuple[str, int | None]


@dataclass(frozen=True)
class ResourceNeed:
    name: str
    count: int
    is_global: bool


@dataclass(eq=False)
class LimitedInstance:
    """One instance as the limiter sees it; ``acquire`` waits for an execution's grant."""

    limiter: RateLimiter
    name: str
    device: int
    needs: tuple[ResourceNeed, ...]
    priority: int
    executions: int = 0

    async def acquire(self) -> Permit:
        return await self.limiter.acquire(self)

    def pools(self) -> Iterator[tuple[PoolKey, int]]:
        for need in self.needs:
            yield (need.name, None if need.is_global else self.device), need.count


@dataclass(eq=False)
class Permit:
    """One granted execution; ``release`` (idempotent) frees its resources."""

    limiter: RateLimiter
    member: LimitedInstance
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter.release(self)


@dataclass(eq=False)
class _Waiter:
    member: LimitedInstance
    seq: int
    future: asyncio.Future[Permit] = field(repr=False)


class RateLimiter:
    """Grants executions to instances of every model (cross-model priorities)."""

    def __init__(self, explicit: Mapping[PoolKey, int]) -> None:
        self._explicit = {
            (name.lower(), device): count for (name, device), count in explicit.items()
        }
        self._members: list[LimitedInstance] = []
        self._in_use: dict[PoolKey, int] = {}
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        self._dispatch_soon = False

    # -- membership ---------------------------------------------------------------------------

    def register(self, model: str, instance: str, device: int, group: Any) -> LimitedInstance:
        """Add one instance with its group's ``rate_limiter`` (a ``ModelRateLimiter`` message);
        InvalidArgument when the flags leave fewer copies of a resource than it needs."""
        needs = tuple(
            ResourceNeed(r.name.lower(), r.count, getattr(r, "global"))
            for r in group.resources
            if r.count > 0
        )
        member = LimitedInstance(self, instance, device, needs, max(1, group.priority))
        where = f"instance '{instance}' of model '{model}'"
        self._check_scopes(member, where)
        for (name, pool_device), count in member.pools():
            limit = self._explicit_count(name, pool_device)
            if limit is not None and limit < count:
                pool = "globally" if pool_device is None else f"on device {pool_device}"
                # Triton's words first (its QA greps for them), then which instance it was.
                raise InvalidArgument(
                    f'Resource count for "{name}" is limited to {limit} which will prevent '
                    "scheduling of one or more model instances, the minimum required count "
                    f"is {count} ({where} needs {count} {pool}; --rate-limit-resource)"
                )
        self._members.append(member)
        return member

    def forget(self, member: LimitedInstance) -> None:
        if member in self._members:
            self._members.remove(member)
        for waiter in [w for w in self._waiting if w.member is member]:
            self._waiting.remove(waiter)
            waiter.future.cancel()
        self._dispatch()

    def capacity(self, key: PoolKey) -> int:
        """Copies of one resource pool: the flag's count, else the most any member needs."""
        name, device = key
        limit = self._explicit_count(name, device)
        if limit is not None:
            return limit
        return max(
            (count for m in self._members for pool, count in m.pools() if pool == key), default=0
        )

    def _explicit_count(self, name: str, device: int | None) -> int | None:
        """The flags' copies of a resource; None when no flag names it. As in Triton, a
        resource the flags name only for other devices has none on this one, and a global
        resource has the most any flag gives it, whatever its device."""
        named = [
            (flag_device, count) for (n, flag_device), count in self._explicit.items() if n == name
        ]
        if not named:
            return None
        if device is None:
            return max(count for _, count in named)
        return max((count for d, count in named if d is None or d == device), default=0)

    def _check_scopes(self, member: LimitedInstance, where: str) -> None:
        """A resource is either global or per device across every loaded model (Triton's
        check: one name cannot be both one pool and a pool per device)."""
        known = [need for other in self._members for need in other.needs] + list(member.needs)
        for need in member.needs:
            if any(o.name == need.name and o.is_global != need.is_global for o in known):
                scope = "global" if need.is_global else "per device"
                raise InvalidArgument(
                    f'Resource "{need.name}" is present as both global and device-specific '
                    f"resource in the model configuration. ({where} declares it {scope}; "
                    "another instance the other way)"
                )

    # -- grants -------------------------------------------------------------------------------

    async def acquire(self, member: LimitedInstance) -> Permit:
        future: asyncio.Future[Permit] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(member, next(self._seq), future)
        self._waiting.append(waiter)
        self._dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif future.done() and not future.cancelled():
                future.result().release()  # granted as we were cancelled: give it back
            raise

    def release(self, permit: Permit) -> None:
        """Free a grant's resources. The next grant is decided on the loop's next turn, so
        that the instance that just finished, when it has more work, asks again first and
        competes by its count and priority (granting at once would hand every turn to whoever
        waited, and priorities would never matter)."""
        self._take_back(permit.member)
        if self._dispatch_soon:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._dispatch()
            return
        self._dispatch_soon = True
        loop.call_soon(self._deferred_dispatch)

    def _deferred_dispatch(self) -> None:
        self._dispatch_soon = False
        self._dispatch()

    def in_use(self, key: PoolKey) -> int:
        return self._in_use.get(key, 0)

    def _free(self, member: LimitedInstance) -> bool:
        return all(
            self._in_use.get(key, 0) + count <= self.capacity(key) for key, count in member.pools()
        )

    def _dispatch(self) -> None:
        while self._waiting:
            head = min(
                self._waiting, key=lambda w: (w.member.executions * w.member.priority, w.seq)
            )
            if head.future.done():  # cancelled while waiting
                self._waiting.remove(head)
                continue
            if not self._free(head.member):
                return
            self._grant(head)

    def _take_back(self, member: LimitedInstance) -> None:
        for key, count in member.pools():
            self._in_use[key] = self._in_use.get(key, 0) - count

    def _grant(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        for key, count in waiter.member.pools():
            self._in_use[key] = self._in_use.get(key, 0) + count
        waiter.member.executions += 1
        waiter.future.set_result(Permit(self, waiter.member))


__all__ = ["LimitedInstance", "Permit", "RateLimiter", "ResourceNeed"]
