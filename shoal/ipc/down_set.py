"""A stub's down rings: the core's channel and one per frontend worker that sends directly.

With direct dispatch (docs/decisions.md) a frontend worker writes a plain model's Executes
straight into a ring of its own to each instance, so the stub reads several rings. Every one of
them shares the core channel's down doorbell (``Channel.create(down_bell=...)``), so the stub
sleeps on one fd: it marks itself asleep on every ring, looks at each once more, then sleeps;
a producer that finds the mark on its ring rings the shared bell, as with one ring (docs/ipc.md,
"Wake-ups": the argument holds ring by ring).

The core's ring is read first on every look (control messages and the core's own requests),
then the workers' rings round-robin, a message each, so no worker starves another.
"""

from __future__ import annotations

import time

from shoal.ipc._bell import Deadline
from shoal.ipc._errors import PeerGone
from shoal.ipc.queue import DEFAULT_SPIN_US, Channel

__all__ = ["CORE", "DownSet"]

#: The origin of a message read from the core's own channel.
CORE = 0


class DownSet:
    """The stub's end of its down rings, by origin (:data:`CORE`, or a worker's number)."""

    def __init__(self, core: Channel, spin_us: float = DEFAULT_SPIN_US) -> None:
        self.core = core
        self._direct: dict[int, Channel] = {}
        self._order: list[tuple[int, Channel]] = []
        self._turn = 0
        self._spin_ns = int(spin_us * 1000)

    def add(self, origin: int, channel: Channel) -> None:
        """Read ``channel`` (a worker's direct channel) from now on; replaces one of the same
        origin (closed)."""
        old = self._direct.pop(origin, None)
        self._direct[origin] = channel
        self._order = list(self._direct.items())
        if old is not None:
            old.close()

    def remove(self, origin: int) -> Channel | None:
        """Stop reading ``origin``'s ring; the caller closes the channel returned."""
        channel = self._direct.pop(origin, None)
        self._order = list(self._direct.items())
        return channel

    def channel(self, origin: int) -> Channel | None:
        """The direct channel of ``origin`` (None: gone, or :data:`CORE`)."""
        return self._direct.get(origin)

    @property
    def origins(self) -> list[int]:
        return list(self._direct)

    def is_empty(self) -> bool:
        if not self.core.down_is_empty():
            return False
        for _, channel in self._order:  # noqa: SIM110 (no generator: once per Execute, compiled)
            if not channel.down_is_empty():
                return False
        return True

    def recv_nowait(self) -> tuple[int, bytes] | None:
        """The next message and its origin, or None when every ring is empty."""
        payload = self.core.recv_down_nowait()
        if payload is not None:
            return CORE, payload
        order = self._order
        count = len(order)
        if not count:
            return None
        for step in range(count):
            at = (self._turn + step) % count
            origin, channel = order[at]
            payload = channel.recv_down_nowait()
            if payload is not None:
                self._turn = at + 1
                return origin, payload
        return None

    def recv(self, timeout: float | None = None) -> tuple[int, bytes]:
        """The next message and its origin; blocks, spinning briefly first. PeerGone once the
        core closed its channel or died, TimeoutError after ``timeout`` seconds."""
        got = self.recv_nowait()
        if got is not None:
            return got
        end = time.perf_counter_ns() + self._spin_ns
        while time.perf_counter_ns() < end:
            got = self.recv_nowait()
            if got is not None:
                return got
        deadline = Deadline(timeout)
        while (got := self._episode(deadline)) is None:
            pass
        return got

    def _episode(self, deadline: Deadline) -> tuple[int, bytes] | None:
        """One sleep over every ring (see ``Channel._down_episode``: it ends at a doorbell)."""
        rings = [self.core, *(channel for _, channel in self._order)]
        for channel in rings:
            channel.begin_down_sleep()
        try:
            while (got := self.recv_nowait()) is None:
                if self.core.peer_closed:
                    raise PeerGone("the supervisor closed the channel")
                if self.core.sleep_on_down_bell(deadline.remaining()):
                    return self.recv_nowait()
            return got
        finally:
            for channel in rings:
                channel.end_down_sleep()

    def close_direct(self) -> None:
        """Close every worker's channel (the stub is exiting)."""
        for _, channel in self._order:
            channel.close()
        self._direct.clear()
        self._order = []
