"""EnsembleRunner over in-process step models: the order steps start in, what a request holds
and gives back, and how a failure or a client going away ends the other steps."""

from __future__ import annotations

import asyncio

import pytest

from shoal.config import load_model_config
from shoal.core.errors import ModelError
from shoal.core.types import InferRequest
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.work import Completion, Work
from tests.integration.server import BUNDLED, TEST_MODELS

pytestmark = pytest.mark.timeout(30)


class _Instance:
    def __init__(self) -> None:
        self.released: list[Block] = []

    def release_outputs(self, proc, blocks):
        self.released.extend(blocks)


class _StepScheduler:
    """A step model's scheduler: hands its work to the test's repository."""

    def __init__(self, repository, name):
        self._repository = repository
        self._name = name

    def submit(self, work):
        self._repository._submit(self._name, work)


class _Repository:
    """Step models that answer when the test says so; each output gets a block of its own."""

    def __init__(self) -> None:
        self.instance = _Instance()
        self.submitted: list[tuple[str, Work]] = []
        self.given: list[Block] = []
        self.block_of: dict[tuple[str, str], Block] = {}  # (model, output) -> its last block
        self.versions: dict[str, ModelVersion] = {}
        self.changed = asyncio.Event()

    def resolve(self, name, version):
        if name not in self.versions:
            repo = TEST_MODELS if (TEST_MODELS / name).is_dir() else BUNDLED
            mv = ModelVersion(name, 1, load_model_config(repo / name), {}, ModelState.READY)
            mv.scheduler = _StepScheduler(self, name)  # ModelVersion is compiled: no patching
            self.versions[name] = mv
        return self.versions[name]

    def _submit(self, name, work):
        self.submitted.append((name, work))
        self.changed.set()

    def answer(self, name, error=None):
        """Answer the first unanswered request of model ``name``."""
        work = next(w for n, w in self.submitted if n == name and not w.future.done())
        config = self.versions[name].config
        outputs = []
        for spec in config.outputs:
            block = Block(7, 0, 64 * len(self.given), 16)
            self.given.append(block)
            self.block_of[name, spec.name] = block
            outputs.append(TensorDesc(spec.name, spec.datatype, (4,), block))
        response = msg.ResponseRecord(outputs=outputs, error=error)
        work.future.set_result(Completion(response, self.instance, None, list(_blocks(outputs))))

    def names(self):
        return [name for name, _ in self.submitted]

    async def until(self, count):
        while len(self.submitted) < count:
            self.changed.clear()
            await self.changed.wait()


def _blocks(outputs):
    return [o.location for o in outputs]


def _offsets(blocks):
    return sorted(b.offset for b in blocks)


class _Directory:
    def view(self, block):
        return memoryview(b"")


def _start(models, name, freed):
    runner = EnsembleRunner(models, _Directory(), freed.extend)
    mv = models.resolve(name, "")
    outputs = [t.name for t in mv.config.outputs]
    inputs = [TensorDesc("X", "FP32", (4,), Block(0, 0, 0, 16))]
    record = msg.RequestRecord("id", 0, 0, {}, outputs, inputs)
    return asyncio.ensure_future(runner.run(mv, InferRequest(name), record, [Block(0, 0, 0, 16)]))


def test_independent_steps_start_together_and_the_join_waits_for_both():
    async def scenario():
        models, freed = _Repository(), []
        request = _start(models, "ens_diamond", freed)
        await models.until(2)
        assert models.names() == ["ens_scale", "identity"]
        models.answer("identity")
        await asyncio.sleep(0)
        assert models.names() == ["ens_scale", "identity"]  # add_sub still waits for A
        models.answer("ens_scale")
        await models.until(3)
        add_sub = models.submitted[2][1]
        assert {t.name: t.location for t in add_sub.record.inputs} == {
            "INPUT0": models.block_of["ens_scale", "Y"],
            "INPUT1": models.block_of["identity", "OUT_FP32"],
        }
        models.answer("add_sub")
        response = await request
        assert [o.name for o in response.outputs] == ["SUM", "DIFF"]
        assert models.versions["identity"].stats.snapshot().inference_count == 1
        response.release()
        assert _offsets(models.instance.released) == _offsets(models.given)
        assert freed == [Block(0, 0, 0, 16)]

    asyncio.run(scenario())


def test_a_failed_step_fails_the_request_names_the_ensemble_and_stops_the_others():
    async def scenario():
        models, freed = _Repository(), []
        request = _start(models, "ens_diamond", freed)
        await models.until(2)
        models.answer("identity", error=("INVALID_ARG", "boom"))
        with pytest.raises(ModelError, match=r"^in ensemble 'ens_diamond', boom$"):
            await request
        scale = models.submitted[0][1]
        assert scale.future.cancelled()  # dropped from its queue, as a client's cancel would
        assert _offsets(models.instance.released) == _offsets(models.given)
        assert freed == [Block(0, 0, 0, 16)]
        stats = models.versions["identity"].stats.snapshot()
        assert stats.inference_stats.fail.count == 1

    asyncio.run(scenario())


def test_a_client_going_away_drops_the_running_steps_and_frees_everything():
    async def scenario():
        models, freed = _Repository(), []
        request = _start(models, "ens_nested", freed)
        await models.until(2)  # the nested diamond's first two steps
        models.answer("ens_scale")
        await asyncio.sleep(0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert all(w.future.done() for _, w in models.submitted)
        assert _offsets(models.instance.released) == _offsets(models.given)
        assert freed == [Block(0, 0, 0, 16)]

    asyncio.run(scenario())


def test_a_nested_ensemble_runs_inside_the_request_and_counts_once():
    async def scenario():
        models, freed = _Repository(), []
        request = _start(models, "ens_nested", freed)
        for name, count in (("ens_scale", 2), ("identity", 2), ("add_sub", 3)):
            await models.until(count)
            models.answer(name)
        await models.until(4)
        assert models.names() == ["ens_scale", "identity", "add_sub", "add_sub"]
        models.answer("add_sub")
        response = await request
        assert [o.name for o in response.outputs] == ["TOTAL", "SPREAD"]
        assert models.versions["ens_diamond"].stats.snapshot().inference_count == 1
        assert models.versions["add_sub"].stats.snapshot().inference_count == 2
        response.release()
        assert _offsets(models.instance.released) == _offsets(models.given)

    asyncio.run(scenario())
