"""The drain gate: counts requests in flight, refuses new ones once closed, waits for the rest."""

from __future__ import annotations

import asyncio

import pytest

from shoal.core.errors import ErrorCode, ShoalError
from shoal.supervisor.drain import DrainGate


def test_closed_gate_refuses_with_unavailable_naming_the_model():
    gate = DrainGate()
    gate.enter("add_sub")
    gate.close()
    with pytest.raises(ShoalError) as info:
        gate.enter("add_sub")
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert "'add_sub'" in info.value.message
    assert gate.in_flight == 1


def test_drained_waits_for_the_requests_in_flight():
    async def scenario() -> tuple[bool, bool]:
        gate = DrainGate()
        gate.enter("m")
        gate.enter("m")
        gate.close()
        early = await gate.drained(0.01)
        loop = asyncio.get_running_loop()
        loop.call_soon(gate.leave)
        loop.call_soon(gate.leave)
        return early, await gate.drained(5)

    assert asyncio.run(scenario()) == (False, True)


def test_an_idle_gate_is_drained_at_once():
    assert asyncio.run(DrainGate().drained(0)) is True
