"""make_scheduler's choice, the per-stub thread defaults and rejections of streamed requests."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shoal.core.errors import ShoalError
from shoal.supervisor.models.instance_specs import thread_env
from shoal.supervisor.schedulers import (
    DefaultScheduler,
    DynamicBatcher,
    SequenceBatcher,
    make_scheduler,
)

from .helpers import Arenas, Loopback, ManualClock, load_config, make_work, result, settle

pytestmark = pytest.mark.timeout(10)

MODEL = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        ("", DefaultScheduler),
        ("dynamic_batching { }", DynamicBatcher),
        ("sequence_batching { }", SequenceBatcher),
        ("sequence_batching { oldest { max_candidate_sequences: 2 } }", SequenceBatcher),
    ],
)
def test_the_config_picks_the_scheduler(tmp_path, extra, kind):
    async def scenario():
        config = load_config(tmp_path, MODEL + extra)
        scheduler = make_scheduler(config, 2, lambda w: None, lambda *a: None)
        assert isinstance(scheduler, kind)
        assert scheduler.pending == 0
        assert scheduler.close() == []

    asyncio.run(scenario())


def test_thread_env_sets_nothing_unless_asked():
    assert thread_env({}, 4, environ={}, cpus=16) == {}  # the stub inherits, as in Triton
    assert thread_env({"MKL_NUM_THREADS": "7"}, 4, environ={}, cpus=16) == {"MKL_NUM_THREADS": "7"}


def test_thread_env_shares_the_cpus_when_asked():
    auto = {"SHOAL_THREADS_PER_INSTANCE": "auto"}
    assert thread_env(auto, 4, environ={}, cpus=16) == {
        "OMP_NUM_THREADS": "4",
        "MKL_NUM_THREADS": "4",
        "OPENBLAS_NUM_THREADS": "4",
    }
    assert thread_env(auto, 32, environ={}, cpus=16)["OMP_NUM_THREADS"] == "1"
    # The server's environment is inherited (not set); a model parameter wins over both.
    env = thread_env({**auto, "MKL_NUM_THREADS": "7"}, 2, environ={"OMP_NUM_THREADS": "2"}, cpus=8)
    assert env == {"MKL_NUM_THREADS": "7", "OPENBLAS_NUM_THREADS": "4"}
    assert thread_env({"SHOAL_THREADS_PER_INSTANCE": "3"}, 2, environ={}, cpus=8) == {
        name: "3" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    }
    assert thread_env({"SHOAL_THREADS_PER_INSTANCE": "many"}, 2, environ={}, cpus=8) == {}


def test_direct_queue_delay_waits_for_slot_utilization(tmp_path):
    async def scenario():
        clock = ManualClock()
        arenas = Arenas()
        text = MODEL + (
            "sequence_batching { direct { max_queue_delay_microseconds: 1000 "
            "minimum_slot_utilization: 0.5 } }"
        )
        config = load_config(tmp_path, text)
        scheduler = make_scheduler(config, 1, arenas.free_work, arenas.stage, clock)
        inst = Loopback(scheduler.source(0), arenas)
        x = {"X": np.zeros((1, 1), np.float32)}
        first = make_work(arenas, x, corr=1, flags=1)
        scheduler.submit(first)
        assert await inst.nothing_pulled()  # 1 of 4 slots ready: below 0.5
        clock.advance_us(1001)  # the oldest request waited longer than the delay
        assert await inst.take() == [first]
        inst.finish()
        await result(first)
        works = [make_work(arenas, x, corr=c, flags=1) for c in (2, 3)]
        for work in works:
            scheduler.submit(work)
        batch = await inst.take()  # 2 of 4 ready (slots 0 and 1 free again): at once
        assert [w for w in batch if w in works] == works
        inst.finish()
        for work in works:
            await result(work)
        await inst.stop()
        assert scheduler.close() == []
        await settle()
        assert arenas.used == 0
        arenas.close()

    asyncio.run(scenario())


def test_a_rejected_streamed_request_ends_its_stream(tmp_path):
    async def scenario():
        arenas = Arenas()
        config = load_config(tmp_path, MODEL + "sequence_batching { }")
        scheduler = make_scheduler(config, 1, arenas.free_work, arenas.stage, ManualClock())
        work = make_work(arenas, {"X": np.zeros((1, 1), np.float32)})  # no correlation id
        work.stream = asyncio.Queue()
        scheduler.submit(work)
        error = work.stream.get_nowait()
        assert isinstance(error, ShoalError) and "correlation ID" in str(error)
        assert work.stream.get_nowait() is None
        assert work.future.cancelled()
        assert arenas.used == 0
        arenas.close()

    asyncio.run(scenario())


def test_default_scheduler_rejects_after_close(tmp_path):
    async def scenario():
        arenas = Arenas()
        scheduler = DefaultScheduler(arenas.free_work)
        assert scheduler.source(3) is scheduler
        scheduler.close()
        work = make_work(arenas, {"X": np.zeros((1, 1), np.float32)})
        scheduler.submit(work)
        with pytest.raises(ShoalError, match="unloading"):
            await work.future
        assert arenas.used == 0
        arenas.close()

    asyncio.run(scenario())
