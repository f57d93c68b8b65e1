"""eventfd doorbells and the two ways to sleep on one: a blocking poll and an asyncio future."""

from __future__ import annotations

import asyncio
import math
import os
import select
import time
from typing import Final

from shoal.ipc._errors import PeerGone

#: How long a producer waiting for room trusts the space doorbell before re-checking the ring on
#: its own: it bounds the delay of the one wake-up the store->load race can lose there
#: (docs/ipc.md, "Wake-ups").
BACKSTOP_S: Final = 0.001
#: Without a pidfd for the peer, a blocked stub polls its parent pid this often.
ORPHAN_CHECK_S: Final = 0.5


def new_bell() -> int:
    # Non-blocking so a drain never blocks; close-on-exec so only the stub we spawn inherits it.
    return os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def ring_bell(fd: int) -> None:
    os.eventfd_write(fd, 1)


def drain_bell(fd: int) -> bool:
    """Reset the bell; True if it had rung since the last drain."""
    try:
        return os.eventfd_read(fd) > 0
    except BlockingIOError:
        return False


class BlockingSleeper:
    """Sleeps on one doorbell while also watching the peer's pidfd (or, lacking one, its pid)."""

    def __init__(self, bell: int, peer_pidfd: int | None) -> None:
        self._bell = bell
        self._pidfd = peer_pidfd
        self._parent = os.getppid()
        self._poller = select.poll()
        self._poller.register(bell, select.POLLIN)
        if peer_pidfd is not None:
            self._poller.register(peer_pidfd, select.POLLIN)

    def sleep(self, timeout: float | None) -> bool:
        """True when the bell rang, False when ``timeout`` passed; PeerGone if the peer died."""
        if self._pidfd is None:
            timeout = ORPHAN_CHECK_S if timeout is None else min(timeout, ORPHAN_CHECK_S)
        millis = -1 if timeout is None else max(1, math.ceil(timeout * 1000))
        rang = False
        for fd, _ in self._poller.poll(millis):
            if fd == self._pidfd:
                raise PeerGone("the supervisor process exited")
            rang = drain_bell(fd)
        if self._pidfd is None and os.getppid() != self._parent:
            raise PeerGone("the supervisor process exited (re-parented)")
        return rang


class Spinner:
    """Adaptive spin budget: spin about twice as long as recent short waits actually took."""

    def __init__(self, max_us: float) -> None:
        self._max_ns = int(max_us * 1000)
        self.budget_ns = self._max_ns // 2

    def observe_sleep(self, waited_ns: int) -> None:
        if waited_ns <= self._max_ns:
            self.budget_ns = min(self._max_ns, 2 * waited_ns)
        else:
            self.budget_ns //= 2


class Backstop:
    """When a sleep episode may stop re-checking on its own: BACKSTOP_S after it began.

    Created right after the episode's flag store. A wake-up (even a spurious one, from a doorbell
    rung for an earlier episode) does not count: only a re-check made after ``BACKSTOP_S`` does.
    """

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until = time.monotonic() + BACKSTOP_S

    def timeout(self) -> float | None:
        """How long to sleep before the next re-check; None once the backstop time has passed."""
        left = self._until - time.monotonic()
        return left if left > 0 else None


class Deadline:
    """Remaining time of an optional timeout; TimeoutError once it has passed."""

    def __init__(self, timeout: float | None) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self, cap: float | None = None) -> float | None:
        if self._end is None:
            return cap
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out waiting on the channel")
        return left if cap is None else min(left, cap)


class AsyncSleeper:
    """Awaits one doorbell on an event loop; ``fail_all`` wakes every waiter with PeerGone."""

    def __init__(self, bell: int, peer_pidfd: int | None = None) -> None:
        self._bell = bell
        self._pidfd = peer_pidfd
        self._waiters: dict[asyncio.Future[bool], asyncio.AbstractEventLoop] = {}

    async def sleep(self, timeout: float | None) -> bool:
        """True when the bell rang, False when ``timeout`` passed; PeerGone if the peer died."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters[waiter] = loop
        loop.add_reader(self._bell, _wake, waiter, True)
        if self._pidfd is not None:
            loop.add_reader(self._pidfd, _wake, waiter, "the supervisor process exited")
        timer = None if timeout is None else loop.call_later(timeout, _wake, waiter, False)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            rang = False
            if self._waiters.pop(waiter, None) is not None:
                self._unregister(loop)
                # A ring that lands after a timeout must still count: it ends the episode.
                rang = drain_bell(self._bell)
        return rang

    def fail_all(self, reason: str) -> None:
        for waiter in list(self._waiters):
            _wake(waiter, reason)

    def close(self, reason: str) -> None:
        """Fail every waiter and unregister its fds now, before the caller closes them."""
        waiters, self._waiters = self._waiters, {}
        for waiter, loop in waiters.items():
            _wake(waiter, reason)
            self._unregister(loop)

    def _unregister(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._bell)
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)


def _wake(waiter: asyncio.Future[bool], outcome: bool | str) -> None:
    """Resolve a sleep: True (the bell rang), False (timed out) or a PeerGone reason."""
    if waiter.done():
        return
    if isinstance(outcome, str):
        waiter.set_exception(PeerGone(outcome))
    else:
        waiter.set_result(outcome)
