"""A bounded spin of an event loop after it sent work out: the answer is polled for, not slept on.

A process that hands a request on (the core an Execute to a stub, a frontend worker a call to
the core) usually gets its answer some tens of microseconds later. Asleep in ``epoll_wait`` it
pays a wake-up for it (the kernel's scheduler, often on another CPU); polling it pays nothing.
:class:`LoopSpin` keeps the loop turning with a callback that re-arms itself with ``call_soon``
(so the loop polls its descriptors with a zero timeout) for a budget after each :func:`kick`,
then lets it sleep. The budget adapts as the stub's ``_bell.Spinner`` does: about twice the
waits that ended within it, halved after a wait that outlasted it. Only the process that
installed a spin polls; :func:`kick` elsewhere (the stubs) is one global read.

``--busy-poll-us``: 0 turns it off; ``auto`` spins always where the machine has a core to spare
after the core, the workers and the stubs have one each (:func:`auto_budget_us`), and elsewhere
only while the machine has idle cores (:class:`IdleCores`, sampled twice a second): a lightly
loaded many-core server (c=1 on 16 cores) has them and pays no wake-ups, a loaded one (or two
cores) has none and keeps its CPU for the stubs. An idle loop stops polling one budget after
the last kick.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "DEFAULT_SPIN_US",
    "IDLE_SPIN_US",
    "IdleCores",
    "LoopSpin",
    "auto_budget_us",
    "install",
    "kick",
    "uninstall",
]

#: The longest budget ``auto`` picks, in microseconds: about a stub's execute and answer for a
#: small request; longer waits are not worth a core.
DEFAULT_SPIN_US: Final = 100.0
#: The longest budget of a spin gated on idle cores: cores are idle whenever it runs, so it may
#: also wait out a worker's whole round trip through the core and a stub (one request at c=1).
IDLE_SPIN_US: Final = 200.0
#: A loop turn that took longer than this ran something besides the spin: work came in.
_WORK_GAP_NS: Final = 10_000
#: How often a spin gated on idle cores looks at the machine again, in seconds.
IDLE_SAMPLE_S: Final = 0.5


class LoopSpin:
    """Keeps ``loop`` polling for up to ``max_us`` after each :meth:`kick`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_us: float,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._max_ns = int(max_us * 1000)
        self._floor_ns = self._max_ns // 8
        self.budget_ns = self._max_ns // 2
        self.spinning = False
        #: False while the machine has no idle cores to spin on (``install(when_idle=True)``).
        self.allowed = True
        self._kicked = 0
        self._until = 0
        self._last = 0
        self._waiting = False
        #: Loop turns spun, kicks taken and waits that ended in the spin (for tests and figures).
        self.turns = 0
        self.kicks = 0
        self.caught = 0

    def kick(self) -> None:
        """Work was sent out: poll for its answer for one budget from now."""
        if not self.allowed:
            return
        now = self._clock()
        self.kicks += 1
        self._kicked = now
        self._until = now + self.budget_ns
        self._waiting = True
        if not self.spinning:
            self.spinning = True
            self._last = now
            self._loop.call_soon(self._turn)

    def stop(self) -> None:
        """Stop at the next turn (the loop is closing)."""
        self._until = 0

    def _turn(self) -> None:
        now = self._clock()
        self.turns += 1
        if now - self._last > _WORK_GAP_NS and self._waiting:
            self._caught(now - self._kicked)
        self._last = now
        if now < self._until:
            self._loop.call_soon(self._turn)
            return
        self.spinning = False
        if self._waiting:  # nothing came within the budget: the waits are long now
            self._waiting = False
            self.budget_ns = max(self._floor_ns, self.budget_ns // 2)

    def _caught(self, waited_ns: int) -> None:
        self.caught += 1
        self._waiting = False
        self.budget_ns = max(self._floor_ns, min(self._max_ns, 2 * waited_ns))


class IdleCores:
    """How many of the machine's cores were idle since the last look (``/proc/stat``)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self._path = path
        self._last: tuple[int, int] | None = None

    def sample(self) -> float:
        """Idle cores (idle and iowait time) since the previous call; 0.0 on the first call
        or where ``/proc/stat`` cannot be read."""
        try:
            with open(self._path) as stat:
                text = stat.read()
        except OSError:
            return 0.0
        idle, total, cores = _cpu_times(text)
        last, self._last = self._last, (idle, total)
        if last is None or total <= last[1]:
            return 0.0
        return cores * (idle - last[0]) / (total - last[1])


def _cpu_times(text: str) -> tuple[int, int, int]:
    """(idle + iowait jiffies, all jiffies, cores) from ``/proc/stat``'s text."""
    lines = text.splitlines()
    fields = [int(f) for f in lines[0].split()[1:]]
    cores = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8]), max(1, cores)


def spare_cores_needed(cores: int) -> float:
    """Idle cores a spin gated on them waits for: a quarter of the machine, 3 at least (the
    spinning worker and core, and one to keep free)."""
    return max(3.0, cores / 4)


class IdleGate:
    """Allows ``spin`` while the machine has ``needed`` idle cores, looking every
    ``IDLE_SAMPLE_S`` on ``loop``. Once allowed, it stops below half of ``needed``: the spins
    it allows take some of the idle time they were allowed on."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        spin: LoopSpin,
        needed: float,
        idle_cores: Callable[[], float] | None = None,
    ) -> None:
        self._loop = loop
        self._spin = spin
        self._needed = needed
        #: Idle cores since its previous call (``IdleCores.sample``).
        self._idle_cores = idle_cores or IdleCores().sample
        self._timer: asyncio.TimerHandle | None = None
        spin.allowed = False  # until a first interval has been seen
        self._idle_cores()
        self._timer = loop.call_later(IDLE_SAMPLE_S, self.look)

    def look(self) -> None:
        spin = self._spin
        idle = self._idle_cores()
        spin.allowed = idle >= (self._needed / 2 if spin.allowed else self._needed)
        self._timer = self._loop.call_later(IDLE_SAMPLE_S, self.look)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_spin: LoopSpin | None = None
_gate: IdleGate | None = None


def kick() -> None:
    """This process sent work out: spin for the answer, if a spin is installed."""
    spin = _spin
    if spin is not None:
        spin.kick()


def install(
    loop: asyncio.AbstractEventLoop, max_us: float, when_idle: bool = False
) -> LoopSpin | None:
    """Spin ``loop`` after each :func:`kick` in this process; None when ``max_us`` is 0.
    ``when_idle``: only while the machine has idle cores to spare (:class:`IdleGate`)."""
    global _spin, _gate
    uninstall()
    _spin = LoopSpin(loop, max_us) if max_us > 0 else None
    if _spin is not None and when_idle:
        cores = len(os.sched_getaffinity(0))
        _gate = IdleGate(loop, _spin, spare_cores_needed(cores))
    return _spin


def uninstall() -> None:
    global _spin, _gate
    if _gate is not None:
        _gate.stop()
    _gate = None
    if _spin is not None:
        _spin.stop()
    _spin = None


def auto_budget_us(processes: int, cores: int | None = None) -> float:
    """``--busy-poll-us auto``: spin always where a core is left over once each of the server's
    ``processes`` (the core, the frontend workers, the stubs) has one of its own (else only
    while cores are idle: :func:`auto_when_idle`)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return DEFAULT_SPIN_US if cores > processes else 0.0


def auto_when_idle(processes: int, cores: int | None = None) -> bool:
    """``--busy-poll-us auto`` without a core to spare: spin while the machine has idle cores,
    where it has enough for that ever to happen (not on two cores)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return cores <= processes and cores > spare_cores_needed(cores)
