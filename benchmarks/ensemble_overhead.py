"""The supervisor's own cost of ensemble steps and BLS calls, without stubs or sockets.

The step model is a loopback: its scheduler answers each request on the next event-loop turn
with the same outputs, so what is measured is only the supervisor's routing of an ensemble
request (``EnsembleRunner``) or of a BLS call (``BlsRouter``), event-loop turns included. Run it
under callgrind for instruction counts that the load of a shared machine does not change::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m benchmarks.ensemble_overhead ensemble 2000
    .venv/bin/python -m benchmarks.ensemble_overhead bls 20000      # wall-clock µs per call

Results: benchmarks/results/ensemble_perf.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import uvloop

from shoal.config import load_model_config
from shoal.core.types import InferRequest
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.calls.bls import BlsRouter
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.models.versions import ModelState, ModelVersion
from shoal.supervisor.work import Completion, Work

MODELS = Path(__file__).parent / "models"
BLOCK = Block(1, 0, 0, 64)


class _Instance:
    """Stands in for a stub instance: releases nothing, views nothing."""

    def release_outputs(self, proc: Any, blocks: list[Block]) -> None:
        pass


class _Loopback:
    """add_sub's scheduler answered in-process: OUTPUT0/OUTPUT1 on the next loop turn."""

    def __init__(self) -> None:
        self.instance = _Instance()
        self.calls = 0

    def submit(self, work: Work) -> None:
        self.calls += 1
        asyncio.get_running_loop().call_soon(self._answer, work)

    def _answer(self, work: Work) -> None:
        outputs = [TensorDesc(name, "FP32", (16,), BLOCK) for name in ("OUTPUT0", "OUTPUT1")]
        response = msg.ResponseRecord(outputs=outputs)
        if not work.future.done():
            work.future.set_result(Completion(response, self.instance, None, []))  # type: ignore[arg-type]


class _Models:
    def __init__(self) -> None:
        self.loopback = _Loopback()
        self.versions = {name: self._version(name) for name in ("add_sub", "ensemble_add_sub")}
        self.versions["add_sub"].submit = self.loopback.submit  # type: ignore[method-assign]

    @staticmethod
    def _version(name: str) -> ModelVersion:
        config = load_model_config(MODELS / name)
        return ModelVersion(name, 1, config, {}, state=ModelState.READY)

    def resolve(self, name: str, version: str) -> ModelVersion:
        return self.versions[name]


class _Directory:
    def view(self, block: Block) -> memoryview:
        return memoryview(b"")

    def fd(self, arena_id: int, index: int) -> tuple[int, int]:
        return -1, 0


class _Caller:
    """The calling stub process: each BLS reply resolves the future of its call."""

    pid = 4242
    returncode = None

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[msg.BlsReply]] = {}

    def forward(self, blocks: list[Block], find: Any) -> None:
        pass

    def send(self, message: msg.Message) -> bool:
        assert isinstance(message, msg.BlsReply) and message.response is not None
        assert message.response.error is None, message.response.error
        self.waiting.pop(message.call_id).set_result(message)
        return True

    async def send_async(self, message: msg.Message) -> None:
        self.send(message)


def _inputs() -> list[TensorDesc]:
    return [TensorDesc(name, "FP32", (16,), BLOCK) for name in ("INPUT0", "INPUT1")]


async def _ensembles(models: _Models, count: int, concurrency: int) -> None:
    runner = EnsembleRunner(models, _Directory(), lambda blocks: None)  # type: ignore[arg-type]
    mv = models.versions["ensemble_add_sub"]

    async def one() -> None:
        record = msg.RequestRecord("", 0, 0, {}, ["OUTPUT0", "OUTPUT1"], _inputs())
        response = await runner.run(mv, InferRequest("ensemble_add_sub"), record, [])
        response.release()

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))
    assert models.loopback.calls == 2 * (count // concurrency) * concurrency


async def _bls_calls(models: _Models, count: int, concurrency: int) -> None:
    router = BlsRouter(models, _Directory())  # type: ignore[arg-type]
    caller = _Caller()
    target: Any = object()  # not an instance of add_sub

    async def worker(first: int, n: int) -> None:
        loop = asyncio.get_running_loop()
        for call_id in range(first, first + n):
            record = msg.RequestRecord("", 0, 0, {}, ["OUTPUT0", "OUTPUT1"], _inputs())
            reply = caller.waiting[call_id] = loop.create_future()
            call = msg.BlsCall(call_id, "add_sub", -1, record, False)
            router.handle(target, caller, call)  # type: ignore[arg-type]
            await reply
            router.done(caller, call_id)  # type: ignore[arg-type]

    per = count // concurrency
    await asyncio.gather(*(worker(1 + i * per, per) for i in range(concurrency)))
    assert models.loopback.calls == per * concurrency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("ensemble", "bls"))
    parser.add_argument("count", type=int, nargs="?", default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    run = _ensembles if args.what == "ensemble" else _bls_calls
    models = _Models()
    started = time.perf_counter()
    uvloop.run(run(models, args.count, args.concurrency))
    took = time.perf_counter() - started
    print(f"{args.what}: {args.count} in {took:.3f} s, {took / args.count * 1e6:.1f} µs each")


if __name__ == "__main__":
    main()
