"""The event loop's busy poll: bounded by its budget, adapted to the waits it sees, stopped when
nothing comes, off without spare cores."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from shoal.ipc import busy_poll
from shoal.ipc.busy_poll import (
    IdleCores,
    IdleGate,
    LoopSpin,
    auto_budget_us,
    auto_when_idle,
    spare_cores_needed,
)

pytestmark = pytest.mark.timeout(10)

US = 1000  # nanoseconds


class StepLoop:
    """Collects ``call_soon`` callbacks for the test to run, one loop turn at a time."""

    def __init__(self) -> None:
        self.ready: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.ready.append(callback)

    def turn(self) -> bool:
        """Run what is ready; False when nothing was."""
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()
        return bool(ready)


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _spin(max_us: float = 100) -> tuple[LoopSpin, StepLoop, Clock]:
    loop, clock = StepLoop(), Clock()
    return LoopSpin(loop, max_us, clock), loop, clock  # type: ignore[arg-type]


def _quiet_turns(loop: StepLoop, clock: Clock, step_ns: int = 2 * US) -> int:
    """Turn the loop with nothing else to do until the spin stops; how many turns it took."""
    turns = 0
    while loop.turn():
        clock.now += step_ns
        turns += 1
        assert turns < 10_000, "the spin did not stop"
    return turns


def test_a_kick_spins_for_its_budget_then_stops():
    spin, loop, clock = _spin(100)
    assert spin.budget_ns == 50 * US
    spin.kick()
    turns = _quiet_turns(loop, clock)
    assert not spin.spinning
    assert 50 * US <= clock.now <= 54 * US
    assert turns == spin.turns
    assert not loop.ready  # nothing re-armed: an idle loop sleeps


def test_a_wait_that_ends_in_the_spin_sets_the_budget_to_twice_it():
    spin, loop, clock = _spin(100)
    spin.kick()
    loop.turn()
    clock.now += 30 * US  # this turn also ran the answer: a long turn
    loop.turn()
    assert spin.caught == 1
    assert spin.budget_ns == 60 * US
    _quiet_turns(loop, clock)


def test_waits_longer_than_the_budget_halve_it_down_to_a_floor():
    spin, loop, clock = _spin(100)
    budgets = []
    for _ in range(6):
        spin.kick()
        _quiet_turns(loop, clock)
        budgets.append(spin.budget_ns)
    assert budgets == [25 * US, 12_500, 12_500, 12_500, 12_500, 12_500]


def test_the_budget_never_exceeds_the_maximum():
    spin, loop, clock = _spin(100)
    spin.kick()
    loop.turn()
    clock.now += 90 * US  # the answer came in a turn of the spin: twice 90 is capped
    loop.turn()
    assert spin.caught == 1
    assert spin.budget_ns == 100 * US
    _quiet_turns(loop, clock)


def test_kicks_while_spinning_extend_it_without_a_second_callback():
    spin, loop, _ = _spin(100)
    spin.kick()
    spin.kick()
    assert len(loop.ready) == 1


def test_auto_spins_only_with_spare_cores():
    assert auto_budget_us(2, cores=2) == 0  # the core and one stub on two cores
    assert auto_budget_us(16, cores=16) == 0  # core, 7 workers, 8 stubs: none to spare
    assert auto_budget_us(4, cores=16) > 0
    assert auto_budget_us(15, cores=16) > 0


def test_kick_without_an_installed_spin_does_nothing_and_install_0_is_off():
    async def scenario():
        loop = asyncio.get_running_loop()
        assert busy_poll.install(loop, 0) is None
        busy_poll.kick()
        spin = busy_poll.install(loop, 200)
        assert spin is not None
        try:
            busy_poll.kick()
            assert spin.spinning
            for _ in range(1000):  # a real loop: the spin ends after its budget
                await asyncio.sleep(0.001)
                if not spin.spinning:
                    break
            assert not spin.spinning
            turns = spin.turns
            await asyncio.sleep(0.01)
            assert spin.turns == turns  # idle: no turn spun
        finally:
            busy_poll.uninstall()

    asyncio.run(scenario())


def _stat(idle: int, busy: int, cores: int = 4) -> str:
    """A ``/proc/stat`` text whose machine spent ``idle`` and ``busy`` jiffies in all."""
    lines = [f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0"]
    lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cores)]
    return "\n".join([*lines, "intr 0", ""])


def test_idle_cores_are_the_idle_share_of_the_interval_times_the_cores(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(_stat(idle=1000, busy=1000))
    idle = IdleCores(str(stat))
    assert idle.sample() == 0.0  # no interval yet
    stat.write_text(_stat(idle=1300, busy=1100))  # 300 of 400 jiffies idle on 4 cores
    assert idle.sample() == pytest.approx(3.0)
    stat.write_text(_stat(idle=1300, busy=1500))  # none idle
    assert idle.sample() == 0.0
    assert IdleCores(str(tmp_path / "missing")).sample() == 0.0


class TimerLoop(StepLoop):
    def __init__(self) -> None:
        super().__init__()
        self.timers: list[Callable[[], None]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerLoop:
        self.timers.append(callback)
        return self  # the handle: its cancel() is never called in these tests

    def cancel(self) -> None:
        raise AssertionError("not cancelled in these tests")


def test_a_spin_gated_on_idle_cores_spins_only_while_they_are_there():
    loop, clock = TimerLoop(), Clock()
    spin = LoopSpin(loop, 100, clock)  # type: ignore[arg-type]
    idle = [0.0, 3.0, 6.5, 2.5, 1.5, 3.5]
    IdleGate(loop, spin, needed=4, idle_cores=lambda: idle.pop(0))  # type: ignore[arg-type]
    spin.kick()  # no interval seen yet: not allowed
    assert not spin.spinning and not loop.ready
    allowed = []
    for _ in range(5):  # 3 idle cores, 6.5, 2.5, 1.5, 3.5
        loop.timers.pop(0)()
        allowed.append(spin.allowed)
        spin.kick()
        assert spin.spinning == spin.allowed
        _quiet_turns(loop, clock)
    # on at 4 idle cores and up; once on, off below 2 (its own spins take some idle time)
    assert allowed == [False, True, True, False, False]
    assert len(loop.timers) == 1  # it keeps looking


def test_auto_spins_while_idle_only_where_the_machine_can_have_idle_cores():
    assert not auto_when_idle(2, cores=2)  # two cores: never
    assert auto_when_idle(16, cores=16)  # the 16-core layout: while cores are idle
    assert not auto_when_idle(4, cores=16)  # a core to spare: always, not gated
    assert spare_cores_needed(16) == 4 and spare_cores_needed(4) == 3


def test_install_when_idle_starts_gated_and_uninstall_stops_looking():
    async def scenario():
        loop = asyncio.get_running_loop()
        spin = busy_poll.install(loop, 100, when_idle=True)
        try:
            assert spin is not None and not spin.allowed
            busy_poll.kick()
            assert not spin.spinning
        finally:
            busy_poll.uninstall()
        assert busy_poll._gate is None

    asyncio.run(scenario())
