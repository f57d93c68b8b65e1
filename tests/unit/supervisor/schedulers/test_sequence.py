"""The sequence batcher (direct and oldest), driven by a manual clock and loopback instances."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shoal.core.errors import ErrorCode, ShoalError
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.supervisor.schedulers import SchedulerConfigError, SequenceBatcher, make_scheduler

from .helpers import Arenas, Loopback, ManualClock, load_config, make_work, result, settle

pytestmark = pytest.mark.timeout(10)

START, END = 1, 2

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: CORRID_TYPE } ] }
  ]
"""


def _config(batch: int, strategy: str, extra: str = "", corrid: str = "TYPE_UINT64") -> str:
    return f"""
name: "m"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000
  {strategy}
  {CONTROLS.replace("CORRID_TYPE", corrid)}
  {extra}
}}
"""


class Setup:
    def __init__(self, tmp_path, text: str, instances: int = 1, model=None, files=None) -> None:
        self.clock = ManualClock()
        self.arenas = Arenas()
        config = load_config(tmp_path, text, files)
        self.scheduler = make_scheduler(
            config, instances, self.arenas.free_work, self.arenas.stage, self.clock
        )
        assert isinstance(self.scheduler, SequenceBatcher)
        kwargs = {} if model is None else {"model": model}
        self.instances = [
            Loopback(self.scheduler.source(i), self.arenas, **kwargs) for i in range(instances)
        ]

    def submit(self, corr, flags=0, x=0.0, **kwargs):
        work = make_work(
            self.arenas, {"X": np.array([[x]], np.float32)}, corr=corr, flags=flags, **kwargs
        )
        self.scheduler.submit(work)
        return work

    def controls(self, work) -> dict:
        """The control values a request carries into the model."""
        values = {
            d.name: self.arenas.read(d).reshape(-1)[0]
            for d in work.record.inputs
            if d.name in ("START", "END", "READY", "CORRID")
        }
        return {k: v.item() if isinstance(v, np.generic) else v for k, v in values.items()}

    async def close(self) -> None:
        for instance in self.instances:
            await instance.stop()
        for work in self.scheduler.close():
            self.arenas.free_work(work)
        await settle()
        assert self.arenas.used == 0, "blocks leaked"
        self.arenas.close()


def run(coro):
    asyncio.run(coro)


async def _error(work) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        await asyncio.wait_for(work.future, 2)
    return info.value


def test_direct_gives_each_sequence_a_batch_position_and_pads_with_null_requests(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(2, "direct { }"), instances=2)
        first, second = s.instances
        a = s.submit(11, START)
        b = s.submit(12, START)  # slot 0 of the second instance: sequences spread out
        c = s.submit(13, START)  # slot 1 of the first instance
        assert await first.take() == [a, c]
        assert await second.take() == [b]
        assert s.controls(a) == {"START": 1.0, "END": 0, "READY": True, "CORRID": 11}
        assert s.controls(c)["CORRID"] == 13
        first.finish()
        second.finish()
        echoed = await result(a)
        assert echoed["START"].tolist() == [[1.0]] and echoed["READY"].tolist() == [[True]]
        await result(b)
        await result(c)
        c2 = s.submit(13, x=5.0)
        batch = await first.take()
        null = batch[0]
        assert batch[1] is c2  # slot 1 stays at position 1
        assert s.controls(null) == {"START": 0.0, "END": 0, "READY": False, "CORRID": 0}
        assert s.arenas.read(null.record.inputs[0]).tolist() == [[0.0]]  # zeros, c2's shape
        assert s.controls(c2) == {"START": 0.0, "END": 0, "READY": True, "CORRID": 13}
        first.finish()
        assert (await result(c2))["X"].tolist() == [[5.0]]
        await s.close()

    run(scenario())


def test_backlog_takes_the_slot_of_an_ended_sequence(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(1, "direct { }"))
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        b1 = s.submit(2, START)  # no free slot: backlog
        b2 = s.submit(2)
        a2 = s.submit(1, END)
        inst.finish()
        assert await inst.take() == [a2]
        assert s.controls(a2)["END"] == 1
        inst.finish()
        assert await inst.take() == [b1]
        inst.finish()
        assert await inst.take() == [b2]
        inst.finish()
        for work in (a1, a2, b1, b2):
            await result(work)
        await s.close()

    run(scenario())


def test_requests_the_sequence_batcher_rejects(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(2, "direct { }"))
        error = await _error(s.submit(0, START))
        assert error.code is ErrorCode.INVALID_ARG
        assert str(error) == (
            "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
        )
        error = await _error(s.submit(7))
        assert str(error) == (
            "inference request for sequence 7 to model 'm' must specify the START flag on the "
            "first request of the sequence"
        )
        two = make_work(s.arenas, {"X": np.zeros((2, 1), np.float32)}, corr=3, flags=START)
        s.scheduler.submit(two)
        error = await _error(two)
        assert "must specify batch-size 1 due to requirements of sequence batcher" in str(error)
        error = await _error(s.submit("abc", START))  # the CORRID control is UINT64
        assert error.code is ErrorCode.INVALID_ARG
        assert str(error) == (  # Triton's words
            "sequence batching control 'CORRID' data-type is 'BYTES', but model 'm' expects "
            "'UINT64'"
        )
        await s.close()

    run(scenario())


def test_string_correlation_ids(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(2, "direct { }", corrid="TYPE_STRING"))
        (inst,) = s.instances
        a = s.submit("alpha", START | END)
        assert await inst.take() == [a]
        assert s.controls(a)["CORRID"] == b"alpha"
        inst.finish()
        assert (await result(a))["CORRID"].tolist() == [[b"alpha"]]
        error = await _error(s.submit(7, START))  # a numeric id: refused, as Triton does
        assert str(error) == (
            "sequence batching control 'CORRID' data-type is 'UINT64', but model 'm' expects "
            "'BYTES'"
        )
        await s.close()

    run(scenario())


def test_idle_sequence_is_released_and_its_slot_reused(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(1, "direct { }"))
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        inst.finish()
        await result(a1)
        s.clock.advance_us(1000)
        b1 = s.submit(2, START)  # backlog: sequence 1 still holds the only slot
        assert await inst.nothing_pulled()
        s.clock.advance_us(4000)  # sequence 1 idle for max_sequence_idle_microseconds
        assert await inst.take() == [b1]
        error = await _error(s.submit(1))
        assert "must specify the START flag on the first request of the sequence" in str(error)
        inst.finish()
        await result(b1)
        s.clock.advance_us(4500)  # sequence 2's idle time started when it got the slot
        b2 = s.submit(2, END)
        assert await inst.take() == [b2]
        inst.finish()
        await result(b2)
        await s.close()

    run(scenario())


def test_backlogged_sequence_times_out(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(1, "direct { }"))
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        b1 = s.submit(2, START, timeout_us=100)
        b2 = s.submit(2)
        s.clock.advance_us(101)
        for work in (b1, b2):
            error = await _error(work)
            assert error.code is ErrorCode.UNAVAILABLE
            assert str(error) == "timeout of the corresponding sequence has been expired"
        inst.finish()
        await result(a1)
        await s.close()

    run(scenario())


STATE = """
  state [ {
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] INITIAL name: "init" }
  } ]
"""


def accumulate(arenas: Arenas, record: RequestRecord) -> ResponseRecord:
    """OUTPUT_STATE = INPUT_STATE + X; also returned as SUM."""
    inputs = {d.name: d for d in record.inputs}
    x = arenas.read(inputs["X"]).astype(np.int32)
    total = arenas.read(inputs["INPUT_STATE"]) + x
    outputs = [arenas.output("SUM", total, "INT32")]
    if "OUTPUT_STATE" in record.requested_outputs:
        outputs.append(arenas.output("OUTPUT_STATE", total, "INT32"))
    return ResponseRecord(outputs)


def _state_config(strategy: str, initial: str) -> str:
    text = _config(2, strategy, STATE.replace("INITIAL", initial))
    return text.replace(
        'output [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        'output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },'
        ' { name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]',
    )


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 2 }"])
def test_implicit_state_accumulates_per_sequence(tmp_path, strategy):
    async def scenario():
        s = Setup(tmp_path, _state_config(strategy, "zero_data: true"), model=accumulate)
        (inst,) = s.instances
        sums = {1: [], 2: []}
        for step, flags in enumerate([START, 0, END]):
            works = {
                corr: s.submit(corr, flags, x=float(corr * 10 + step), outputs=("SUM",))
                for corr in (1, 2)
            }
            assert len(await inst.take()) == 2  # both sequences in one batch
            inst.finish()
            for corr, work in works.items():
                outputs = await result(work)
                assert "OUTPUT_STATE" not in outputs  # the client did not ask for it
                sums[corr].append(int(outputs["SUM"][0][0]))
        assert sums == {1: [10, 21, 33], 2: [20, 41, 63]}
        # A client that asks for the state output sees it.
        work = s.submit(3, START | END, x=4.0, outputs=("SUM", "OUTPUT_STATE"))
        await inst.take()
        inst.finish()
        assert (await result(work))["OUTPUT_STATE"].tolist() == [[4]]
        await s.close()

    run(scenario())


def test_initial_state_from_a_file(tmp_path):
    async def scenario():
        files = {"initial_state/init.bin": np.array([100], np.int32).tobytes()}
        text = _state_config("direct { }", 'data_file: "init.bin"')
        s = Setup(tmp_path, text, model=accumulate, files=files)
        (inst,) = s.instances
        work = s.submit(1, START | END, x=1.0, outputs=("SUM",))
        await inst.take()
        inst.finish()
        assert (await result(work))["SUM"].tolist() == [[101]]
        await s.close()

    run(scenario())


def test_missing_initial_state_file_fails_the_load(tmp_path):
    text = _state_config("direct { }", 'data_file: "missing.bin"')
    config = load_config(tmp_path, text)
    with pytest.raises(SchedulerConfigError, match=r"missing\.bin"):
        make_scheduler(config, 1, lambda w: None, lambda *a: None)


def test_oldest_batches_sequences_but_never_two_requests_of_one(tmp_path):
    async def scenario():
        text = _config(2, "oldest { max_candidate_sequences: 3 }")
        s = Setup(tmp_path, text)
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        b1, c1, a2 = s.submit(2, START), s.submit(3, START), s.submit(1, END)
        d1 = s.submit(4, START)  # three candidates already: backlog
        inst.finish()
        assert await inst.take() == [b1, c1]  # a2 only left its slot when a1 completed
        assert s.controls(b1)["READY"] is True
        inst.finish()
        assert await inst.take() == [a2]
        inst.finish()
        assert await inst.take() == [d1]  # sequence 1 ended: its candidate slot went to 4
        inst.finish()
        for work in (a1, a2, b1, c1, d1):
            await result(work)
        await s.close()

    run(scenario())


def test_direct_requeued_batch_comes_again(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(2, "direct { }"))
        (inst,) = s.instances
        s.submit(1, START)
        s.submit(2, START)
        batch = await inst.take()
        inst.give_back()  # the stub died before the send: the same batch comes again
        assert await inst.take() == batch
        inst.finish()
        for work in batch:
            await result(work)
        b2 = s.submit(2)
        null, again = await inst.take()
        assert again is b2 and s.controls(null)["READY"] is False
        inst.give_back()
        assert await inst.take() == [null, b2]
        inst.finish()
        await result(b2)
        await s.close()

    run(scenario())


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
def test_iterative_sequence_takes_rescheduled_requests_back_into_their_slot(tmp_path, strategy):
    async def scenario():
        s = Setup(tmp_path, _config(1, strategy, "iterative_sequence: true"))
        (inst,) = s.instances
        a = s.submit(0)  # no sequence id: a sequence of its own
        b = s.submit(0)  # the only slot is taken: waits
        assert await inst.take() == [a]
        first = s.controls(a)
        assert first["START"] == 1.0 and first["CORRID"] >= 1 << 62
        inputs = len(a.record.inputs)
        inst.reschedule()
        assert await inst.take() == [a]  # back in its slot, before the waiting sequence
        assert s.controls(a) == {**first, "START": 0.0}
        assert len(a.record.inputs) == inputs  # the last run's controls were replaced
        inst.finish()
        await result(a)
        assert await inst.take() == [b]  # a's sequence ended with it: b gets the slot
        assert s.controls(b)["START"] == 1.0 and s.controls(b)["CORRID"] != first["CORRID"]
        inst.finish()
        await result(b)
        await s.close()

    run(scenario())


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 1 }"])
def test_a_cancelled_request_cancels_its_sequence(tmp_path, strategy):
    """As Triton: the requests queued behind a cancelled one answer CANCELLED, the slot goes to
    the next sequence, and the cancelled sequence needs START again."""

    async def scenario():
        s = Setup(tmp_path, _config(1, strategy))
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        a2, a3 = s.submit(1), s.submit(1)
        b1, b2 = s.submit(2, START), s.submit(2)  # no free slot: backlog
        a2.cancel()
        inst.finish()
        await result(a1)  # the running request is not touched
        assert await inst.take() == [b1]  # sequence 1's slot went to the backlog
        error = await _error(a3)
        assert error.code is ErrorCode.CANCELLED
        assert "sequence 1 to model 'm' was cancelled" in str(error)
        inst.finish()
        assert await inst.take() == [b2]
        inst.finish()
        await result(b1)
        await result(b2)
        error = await _error(s.submit(1))
        assert "must specify the START flag" in str(error)
        await s.close()

    run(scenario())


def test_a_cancelled_backlogged_request_cancels_its_sequence(tmp_path):
    async def scenario():
        s = Setup(tmp_path, _config(1, "direct { }"))
        (inst,) = s.instances
        a1 = s.submit(1, START)
        assert await inst.take() == [a1]
        b1, b2 = s.submit(2, START), s.submit(2)  # backlogged behind sequence 1
        c1 = s.submit(3, START)
        b1.cancel()
        a2 = s.submit(1, END)
        inst.finish()
        assert await inst.take() == [a2]
        inst.finish()
        assert await inst.take() == [c1]  # sequence 2 was cancelled as its slot came
        assert (await _error(b2)).code is ErrorCode.CANCELLED
        inst.finish()
        for work in (a1, a2, c1):
            await result(work)
        await s.close()

    run(scenario())


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 1 }"])
def test_an_update_adds_an_instance_and_retires_one_after_its_sequence(tmp_path, strategy):
    async def scenario():
        s = Setup(tmp_path, _config(1, strategy), instances=1)
        (old,) = s.instances
        a1 = s.submit(1, START)
        assert await old.take() == [a1]
        old.finish()
        # An added instance takes no sequence until it is opened, then the backlogged one.
        added = s.scheduler.add_instance()
        b1 = s.submit(2, START)
        new = Loopback(s.scheduler.source(added), s.arenas)
        s.instances.append(new)
        assert await new.nothing_pulled()
        s.scheduler.open_instance(added)
        assert await new.take() == [b1]
        new.finish()
        # The old instance, retired, keeps its sequence to its end and takes no new one.
        s.scheduler.retire_instance(0)
        released = asyncio.ensure_future(s.scheduler.released(0))
        c1 = s.submit(3, START)  # backlogged: the new instance holds sequence 2
        a2 = s.submit(1)
        assert await old.take() == [a2]
        old.finish()
        assert not released.done()
        a3 = s.submit(1, END)
        assert await old.take() == [a3]
        old.finish()
        await asyncio.wait_for(released, 2)
        assert await old.nothing_pulled()
        b2 = s.submit(2, END)
        assert await new.take() == [b2]
        new.finish()
        assert await new.take() == [c1]  # the slot of the ended sequence, not the retired one
        new.finish()
        for work in (a1, a2, a3, b1, b2, c1):
            await result(work)
        await s.close()

    run(scenario())
