"""The core's own CPU per small request, in one process: the service over a loopback stub.

    .venv/bin/python -m benchmarks.core_path [--requests 20000] [-c 8] [--rounds 3]

Runs ``identity`` (64-byte FP32 tensors, one instance) through the inference service two ways,
``-c`` requests in flight, and prints the process's CPU time per request:

* ``task``: ``InferenceService.infer`` in a task per request (the in-process frontends' way);
* ``callback``: ``InferenceService.start_infer`` answered through a callback (the frontend
  workers' link, without its frames).

The loopback stub (the Execute/Result codec and the model function) runs in the same process
and counts in both, as do the scheduler, the instance and the statistics; no socket, no
doorbell, no other process, so the figures hold still on a busy machine where the served
benchmarks (``benchmarks.overhead``) do not. The median of ``--rounds`` rounds per way.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import shoal._compiled
from shoal.cli import options_from_args
from shoal.core import InferInput, InferRequest, InferResponse
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.service import InferenceService

T = TypeVar("T")

CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
DATA = np.zeros(16, np.float32).tobytes()


def _parser() -> argparse.ArgumentParser:
    try:  # where the flag tables live since the command line was split (issue 20)
        from shoal._serve_parser import build_parser
    except ImportError:  # older trees, for a before/after run
        from shoal.cli import build_parser  # type: ignore[attr-defined,no-redef]
    return build_parser()


def _identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _request() -> InferRequest:
    return InferRequest("identity", inputs=[InferInput("INPUT0", "FP32", (16,), DATA)])


async def _drive(service: InferenceService, way: str, total: int, concurrency: int) -> float:
    """CPU µs per request for ``total`` requests, ``concurrency`` in flight."""
    finished = asyncio.get_running_loop().create_future()
    counts = {"sent": 0, "done": 0}

    def answered(response: InferResponse | None, error: BaseException | None) -> None:
        if response is None:
            if not finished.done():
                finished.set_exception(error or RuntimeError("no response"))
            return
        response.release()
        counts["done"] += 1
        if counts["done"] == total:
            finished.set_result(None)
        else:
            start_next()

    def settled(task: asyncio.Task[Any]) -> None:
        error = task.exception()
        answered(None if error else task.result(), error)

    def start_next() -> None:
        if counts["sent"] == total:
            return
        counts["sent"] += 1
        if way == "callback":
            service.start_infer(_request(), answered)
        else:
            asyncio.ensure_future(service.infer(_request())).add_done_callback(settled)

    started = time.process_time_ns()
    for _ in range(concurrency):
        start_next()
    await finished
    return (time.process_time_ns() - started) / total / 1000


async def _measure(repo: str, requests: int, concurrency: int, rounds: int) -> dict[str, float]:
    args = _parser().parse_args(["serve", "--model-repository", repo])
    service = build_service(options_from_args(args), make_stub=Loopback(lambda name: _identity))
    await service.load_repository()
    try:
        await _drive(service, "task", requests // 10, concurrency)  # warm-up
        ways = ["task", "callback"] if hasattr(service, "start_infer") else ["task"]
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way in samples:
                samples[way].append(await _drive(service, way, requests, concurrency))
        return {way: statistics.median(values) for way, values in samples.items()}
    finally:
        await service.shutdown(5.0)


def on_identity(prefix: str, measure: Callable[[str], Coroutine[Any, Any, T]]) -> T:
    """``measure(repository)`` over a temporary repository of one identity model, on the loop
    shoal serves on (uvloop where installed: asyncio's own loop is Python and would count)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        model = Path(tmp) / "identity"
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(CONFIG)
        (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
        try:
            import uvloop
        except ImportError:
            return asyncio.run(measure(tmp))
        return uvloop.run(measure(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    result = on_identity(
        "shoal-core-path-",
        lambda repo: _measure(repo, options.requests, options.concurrency, options.rounds),
    )
    print(f"hot path {shoal._compiled.state}, c={options.concurrency}, CPU µs per request:")
    for way, value in result.items():
        print(f"  {way:>8}: {value:6.1f}")


if __name__ == "__main__":
    main()
