"""Messages up from a stub, each to its part: the model's log lines, Ready, control and BLS calls,
and a decoupled model's responses, without a process."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from shoal.core.errors import Unavailable
from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.answers import Answers
from shoal.supervisor.instances.decoupled import OpenStreams, new_stream
from shoal.supervisor.instances.dispatch import UpMessages
from shoal.supervisor.instances.handshake import Handshake
from shoal.supervisor.instances.ledger import InFlightLedger
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.instances.outputs import StubOutputs
from shoal.supervisor.instances.process import StubLaunch
from shoal.supervisor.instances.spec import InstanceScope, LoadError
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.schedulers import arena_stager
from shoal.supervisor.work import Completion, Work
from tests.unit.supervisor.instances.helpers import run

pytestmark = pytest.mark.timeout(10)


class Named:
    name = "m_0"


class ControlCalls:
    """Records the control calls routed to it (the control router's place)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, msg.ControlCall]] = []

    def handle(self, caller, proc, call: msg.ControlCall) -> None:
        self.calls.append((caller, call))

    def forget_process(self, proc) -> None:
        pass


class Parts:
    """An instance's parts around one loopback stub, wired as ``StubInstance`` wires them."""

    def __init__(self) -> None:
        self.arena = OwnedArena(0, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 24)
        scope = InstanceScope("m_0", SegmentDirectory(self.arena), self._free)
        self.stats = StatsRecorder("m", 1)
        self.ledger = InFlightLedger(scope, None, True)
        self.streams = OpenStreams(self._free)
        answers = Answers(scope, self.ledger, self.streams, StubOutputs(scope), self.stats)
        self.handshake = Handshake(scope)
        self.control = ControlCalls()
        self.caller = Named()
        calls = (None, self.control)
        self.up = UpMessages(scope, self.caller, calls, answers, self.handshake, self.ledger, 4)
        self.stub = Loopback(lambda name: lambda inputs: None)(StubLaunch("m_0"), 7)
        scope.current.proc = self.stub
        self._stage = arena_stager(self.arena)

    def _free(self, blocks: list) -> None:
        for block in blocks:
            self.arena.free(block)

    def decoupled_work(self, key: int) -> Work:
        desc, block = self._stage("X", "FP32", (1,), b"\0" * 4)
        record = RequestRecord("", 0, 0, {}, [], [desc])
        record.key = key
        future = asyncio.get_running_loop().create_future()
        work = Work(record, [block], future, batch_size=1, stream=new_stream())
        work.dispatched_ns = time.monotonic_ns()
        self.streams.open(work)
        return work

    def close(self) -> None:
        self.stub.close(asyncio.get_running_loop())
        assert self.arena.used_bytes == 0, "input blocks leaked"
        self.arena.close()


def test_the_models_log_lines_carry_the_instance_and_where(caplog):
    async def scenario():
        parts = Parts()
        with caplog.at_level(logging.DEBUG, logger="shoal"):
            parts.up.dispatch(parts.stub, msg.Log(1, "low on memory", "model.py", 12))
            parts.up.dispatch(parts.stub, msg.Execute(1, []))  # never sent up
        warning, unexpected = caplog.records[-2:]
        assert warning.levelno == logging.WARNING
        assert warning.getMessage() == "[m_0] low on memory"
        assert warning.source == "model.py:12"  # the log line's file:line, as in Triton
        assert unexpected.levelno == logging.ERROR
        assert "unexpected message Execute" in unexpected.getMessage()
        parts.close()

    run(scenario())


def test_ready_sizes_the_slots_and_settles_initialize():
    async def scenario():
        parts = Parts()
        parts.handshake.expect_ready()
        parts.up.dispatch(parts.stub, msg.Ready(concurrent=True, user_ready=True))
        await parts.handshake.initialized()
        assert parts.ledger.limit == 4
        assert parts.handshake.user_ready
        parts.handshake.expect_ready()
        parts.up.dispatch(parts.stub, msg.Ready("initialize raised", traceback="Traceback..."))
        with pytest.raises(LoadError, match="initialize raised") as raised:
            await parts.handshake.initialized()
        assert raised.value.traceback == "Traceback..."
        assert parts.ledger.limit == 1  # a sync execute: one batch, SEND_AHEAD more ahead
        parts.close()

    run(scenario())


def test_control_calls_go_to_the_control_router_and_bls_ones_without_a_router_are_dropped():
    async def scenario():
        parts = Parts()
        call = msg.ControlCall(3, msg.ControlOp.IS_MODEL_READY, ["m", -1])
        parts.up.dispatch(parts.stub, call)
        parts.up.dispatch(parts.stub, msg.BlsDone(9))
        assert parts.control.calls == [(parts.caller, call)]
        parts.close()

    run(scenario())


def test_a_decoupled_request_gets_each_response_and_frees_its_inputs_after_the_last():
    async def scenario():
        parts = Parts()
        work = parts.decoupled_work(key=5)
        parts.up.dispatch(parts.stub, msg.Response(5, ResponseRecord([]), final=False))
        parts.up.dispatch(parts.stub, msg.Response(5, ResponseRecord([]), final=True))
        assert work.stream is not None
        first, last, end = (work.stream.get_nowait() for _ in range(3))
        assert isinstance(first, Completion) and not first.final
        assert isinstance(last, Completion) and last.final
        assert end is None
        assert parts.arena.used_bytes > 0  # a response may still read an input
        first.release()
        last.release()
        assert parts.arena.used_bytes == 0
        assert parts.streams.get(5) is None
        parts.up.dispatch(parts.stub, msg.Response(5, ResponseRecord([]), final=True))  # dropped
        parts.close()

    run(scenario())


def test_open_streams_fail_together_when_the_stub_dies():
    async def scenario():
        parts = Parts()
        works = [parts.decoupled_work(key) for key in (1, 2)]
        parts.streams.fail_all(Unavailable("the stub died"))
        for work in works:
            assert work.stream is not None
            assert isinstance(work.stream.get_nowait(), Unavailable)
            assert work.stream.get_nowait() is None
        assert parts.streams.get(1) is None
        parts.close()

    run(scenario())


class Exited:
    """A stub that exited with messages still in its ring."""

    output_arena_id = 7
    returncode = -9
    pid = 2

    def __init__(self, payloads: list[bytes]) -> None:
        self._payloads = payloads

    def recv_up_nowait(self) -> bytes | None:
        return self._payloads.pop(0) if self._payloads else None


def test_an_exited_stubs_last_answers_reach_their_request_past_one_that_does_not_read(caplog):
    async def scenario():
        parts = Parts()
        work = parts.decoupled_work(key=5)
        dead = Exited(
            [
                msg.encode(msg.Response(5, ResponseRecord([]), final=False)),
                b"\xc1\x00",  # the mark of a whole Result, cut short
                msg.encode(msg.Response(5, ResponseRecord([]), final=True)),
            ]
        )
        with caplog.at_level(logging.ERROR, logger="shoal"):
            parts.up.last_words(dead)
        assert work.stream is not None
        first, last, end = (work.stream.get_nowait() for _ in range(3))
        assert isinstance(first, Completion) and not first.final
        assert isinstance(last, Completion) and last.final
        assert end is None
        assert "a message of the exited stub failed" in caplog.text
        first.release()
        last.release()
        parts.close()

    run(scenario())
