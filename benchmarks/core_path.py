"""The core's own CPU per small request, in one process: the service over a loopback stub.

    .venv/bin/python -m benchmarks.core_path [--requests 20000] [-c 8] [--rounds 3]
        [--ways task,callback,link] [--batched]

Runs ``identity`` (64-byte FP32 tensors, one instance) through the inference service three
ways, ``-c`` requests in flight, and prints the process's CPU time per request:

* ``task``: ``InferenceService.infer`` in a task per request (the in-process frontends' way);
* ``callback``: ``InferenceService.start_infer`` answered through a callback (the frontend
  workers' link, without its frames);
* ``packed``: ``link`` with the call a worker relays (``frontends/workers/packing.py``): checked,
  staged and packed by the worker against its snapshot of the model's summary, so the core
  splices the record into the Execute (trees without packed calls skip it);
* ``link``: the frontend workers' link itself, the core's whole side of a worker's call: CALL
  frames as a worker builds them (``wire.frame``) go through the link's real ``FrameReader``
  and ``_Link.on_call`` to ``start_infer``, and the answer frames leave through its real
  ``Outbox``. Only the socket is replaced, by a stand-in that keeps what the core writes and
  sends the next call once an answer arrives (:class:`_WorkerEnd`).

``--batched`` puts the dynamic batcher in front of the same model (``batched_identity``'s
settings: up to 64 requests of shape [1, 16] per Execute, 1 ms queue delay): the core's cost per
request where requests share their Execute and Result; its ``packed`` way, the packed calls of
a batched model (a tree whose workers pack none for a batcher stops there).

The loopback stub (the Execute/Result codec and the model function; small outputs inline in the
Result, as a real stub answers) runs in the same process
and counts in all three, as do the scheduler, the instance and the statistics; no socket, no
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
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.host import _Link

try:
    from shoal.frontends.workers.pool import WorkerPool
except ImportError:  # an older tree: the pool lived beside the link
    from shoal.frontends.workers.host import WorkerPool  # type: ignore[attr-defined,no-redef]
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
#: ``--batched``: the dynamic batcher in front of the same identity (``batched_identity`` of
#: ``benchmarks/models``), requests of shape [1, 16].
BATCHED_CONFIG = CONFIG.replace("max_batch_size: 0", "max_batch_size: 64") + (
    "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
)
DATA = np.zeros(16, np.float32).tobytes()
#: The request's shape: (16,), or (1, 16) with ``--batched``.
SHAPE: list[tuple[int, ...]] = [(16,)]
WAYS = ("task", "callback", "link", "packed")


def _parser() -> argparse.ArgumentParser:
    try:  # where the flag tables live since the command line was split (issue 20)
        from shoal._serve_parser import build_parser
    except ImportError:  # older trees, for a before/after run
        from shoal.cli import build_parser  # type: ignore[attr-defined,no-redef]
    return build_parser()


def _identity(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


def _request() -> InferRequest:
    return InferRequest("identity", inputs=[InferInput("INPUT0", "FP32", SHAPE[0], DATA)])


class _WorkerEnd(asyncio.Transport):
    """The link's socket, seen from the worker: what the core writes is read as answer frames
    (only their kind and call id, the header's first bytes: the worker's decoding is not the
    core's cost), and each answer sends that call id's next CALL frame while ``answered(ok)``
    says so, several in one read when several answers left in one write, as a socket would."""

    def __init__(self, calls: list[bytes], answered: Callable[[bool], bool]) -> None:
        super().__init__()
        #: Each call id's CALL frame (id ``i + 1`` at ``i``), built once as a worker builds it.
        self.calls = calls
        self.reader: wire.FrameReader | None = None
        self._answered = answered
        self._pending: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writelines([data])

    def writelines(self, pieces: Any) -> None:
        for piece in pieces:
            self._read(memoryview(piece))
        if self._pending:
            asyncio.get_running_loop().call_soon(self._deliver, self._pending)
            self._pending = []

    def _read(self, data: memoryview) -> None:
        at = 0
        while at < len(data):
            header, payload = wire.prefix(data, at)
            # [kind, call id, ...]: a fixarray's byte, then two positive fixints.
            kind, call_id = data[at + wire.PREFIX_SIZE + 1], data[at + wire.PREFIX_SIZE + 2]
            at += wire.PREFIX_SIZE + header + payload
            if self._answered(kind == wire.OK):
                self._pending.append(self.calls[call_id - 1])

    def send_calls(self, ids: range) -> None:
        self._deliver([self.calls[call_id - 1] for call_id in ids])

    def _deliver(self, frames: list[bytes]) -> None:
        assert self.reader is not None
        self.reader.data_received(b"".join(frames))


def _call(service: InferenceService, call_id: int, relay: bool) -> bytes:
    """One CALL frame as a worker builds it: relayed, or the request's fields."""
    if relay:
        from shoal.frontends.workers.packing import Snapshot, prepare

        plain = service.packing_summary("identity", "")  # type: ignore[attr-defined]
        if plain is None:  # a tree whose workers pack no request for a batched model
            raise SystemExit("--ways packed: this tree packs no request for this model")
        prepared = prepare(_request(), Snapshot(plain), None)
        assert prepared is not None and prepared.fields is not None
        if isinstance(prepared.fields, bytes):  # a packed call's own frame (core/packed.py)
            from shoal.core.packed import frame

            return b"".join(frame(call_id, prepared.fields, prepared.head))
        header = [wire.CALL, call_id, "packed", prepared.fields]  # before: a MessagePack header
        return b"".join(wire.frame(header, [prepared.head]))
    payloads: list[memoryview | bytes] = []
    fields = wire.request_to_wire(_request(), payloads)
    return b"".join(wire.frame([wire.CALL, call_id, "infer", fields], payloads))


def _link_way(
    service: InferenceService,
    concurrency: int,
    answered: Callable[[bool], bool],
    relay: bool = False,
) -> tuple[_WorkerEnd, _Link]:
    """A worker's link to ``service`` over a stand-in socket, and the call frames it sends."""
    assert concurrency < 128, "the answers' call ids are read as one-byte integers"
    pool = WorkerPool(service, 0, [], {}, b"")  # type: ignore[arg-type]
    link = _Link(service, 0, pool)  # type: ignore[arg-type]
    calls = [_call(service, call_id, relay) for call_id in range(1, concurrency + 1)]
    end = _WorkerEnd(calls, answered)
    on_packed = getattr(link, "on_packed", None)  # a tree whose packed calls have their frame
    if on_packed is None:
        end.reader = wire.FrameReader(link.on_call, link.cancel_all)
    else:
        end.reader = wire.FrameReader(link.on_call, link.cancel_all, on_packed)
    end.reader.connection_made(end)
    link.outbox = wire.Outbox(end)
    return end, link


async def _drive(service: InferenceService, way: str, total: int, concurrency: int) -> float:
    """CPU µs per request for ``total`` requests, ``concurrency`` in flight."""
    if way in ("link", "packed"):
        return await _drive_link(service, total, concurrency, way == "packed")
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


async def _drive_link(
    service: InferenceService, total: int, concurrency: int, relay: bool = False
) -> float:
    """:func:`_drive` through a frontend worker's link (the ``link`` and ``packed`` ways)."""
    finished = asyncio.get_running_loop().create_future()
    first = min(concurrency, total)
    counts = {"sent": first, "done": 0}

    def answered(ok: bool) -> bool:
        if not ok:
            if not finished.done():
                finished.set_exception(RuntimeError("the core answered a call with an error"))
            return False
        counts["done"] += 1
        if counts["done"] == total:
            finished.set_result(None)
        if counts["sent"] == total:
            return False
        counts["sent"] += 1
        return True

    end, link = _link_way(service, concurrency, answered, relay)
    started = time.process_time_ns()
    end.send_calls(range(1, first + 1))
    await finished
    elapsed = time.process_time_ns() - started
    link.outbox = None
    return elapsed / total / 1000


def _loopback() -> Loopback:
    """Small outputs inline in the Result as a real stub sends them (where this tree can)."""
    try:
        return Loopback(lambda name: _identity, inline_outputs=True)
    except TypeError:  # an older tree: every output in a block
        return Loopback(lambda name: _identity)


async def _measure(
    repo: str, requests: int, concurrency: int, rounds: int, ways: list[str]
) -> dict[str, float]:
    args = _parser().parse_args(["serve", "--model-repository", repo])
    service = build_service(options_from_args(args), make_stub=_loopback())
    await service.load_repository()
    try:
        await _drive(service, ways[0], requests // 10, concurrency)  # warm-up
        if not hasattr(service, "start_infer"):  # an old tree: the task way only
            ways = ["task"]
        if not hasattr(service, "start_packed"):  # a tree without the relay
            ways = [way for way in ways if way != "packed"] or ["link"]
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way in samples:
                samples[way].append(await _drive(service, way, requests, concurrency))
        return {way: statistics.median(values) for way, values in samples.items()}
    finally:
        await service.shutdown(5.0)


def on_identity(
    prefix: str, measure: Callable[[str], Coroutine[Any, Any, T]], config: str = CONFIG
) -> T:
    """``measure(repository)`` over a temporary repository of one identity model, on the loop
    shoal serves on (uvloop where installed: asyncio's own loop is Python and would count)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        model = Path(tmp) / "identity"
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config)
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
    parser.add_argument(
        "--ways",
        default=None,
        help="comma-separated, of: " + ", ".join(WAYS) + " (the first also warms up)",
    )
    parser.add_argument(
        "--batched",
        action="store_true",
        help="the dynamic batcher in front of identity (max_batch_size 64, 1 ms queue delay)",
    )
    options = parser.parse_args()
    ways = options.ways.split(",") if options.ways else list(WAYS)
    if not ways or any(way not in WAYS for way in ways):
        parser.error(f"--ways takes some of {', '.join(WAYS)}")
    if options.batched:
        SHAPE[0] = (1, 16)
    result = on_identity(
        "shoal-core-path-",
        lambda repo: _measure(repo, options.requests, options.concurrency, options.rounds, ways),
        BATCHED_CONFIG if options.batched else CONFIG,
    )
    model = "batched identity" if options.batched else "identity"
    print(
        f"{model}, hot path {shoal._compiled.state}, c={options.concurrency}, CPU µs per request:"
    )
    for way, value in result.items():
        print(f"  {way:>8}: {value:6.1f}")


if __name__ == "__main__":
    main()
