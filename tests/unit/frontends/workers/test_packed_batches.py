"""Packed calls for a dynamic-batched model, over a worker's link to a real service and loopback
stub: batched with the requests that came the core's way where their shapes agree and apart
where they do not, a queue timeout's error, and a cancelled queued call's block given back."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import numpy as np
import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core import InferInput, InferRequest
from shoal.core.packed import frame
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import StagingArena
from shoal.frontends.workers.host import _Link
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.service import InferenceService
from tests.unit.frontends.workers.test_packed_link import _close, _freed, _linked, _until

pytestmark = pytest.mark.timeout(30)

CONFIG = """
name: "bat"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 300000
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 60000000
    allow_timeout_override: true
  }
}
"""


def _twice(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["X"] * 2}


@pytest.fixture
def service(tmp_path) -> InferenceService:
    model = tmp_path / "bat"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    args = build_parser().parse_args(["serve", "--model-repository", str(tmp_path)])
    return build_service(options_from_args(args), make_stub=Loopback(lambda name: _twice))


def _request(values: np.ndarray, parameters: dict[str, Any] | None = None) -> InferRequest:
    tensor = InferInput("X", "FP32", values.shape, values.tobytes())
    return InferRequest("bat", inputs=[tensor], parameters=parameters)


def _packed(
    link: _Link, staging: StagingArena, call_id: int, values: np.ndarray, **parameters: Any
) -> list[Any]:
    """Relay a request for ``bat`` as a worker would; the blocks it staged."""
    plain = link.core.packing_summary("bat", "")  # type: ignore[attr-defined]
    assert plain is not None, "a dynamic-batched model's requests come packed"
    prepared = prepare(_request(values, parameters or None), Snapshot(plain), staging.stage)
    assert prepared is not None and prepared.fields is not None
    reader = wire.FrameReader(link.on_call, link.cancel_all, link.on_packed)
    reader.data_received(b"".join(frame(call_id, prepared.fields, prepared.head)))
    return prepared.blocks()


def _batches(service: InferenceService) -> dict[int, int]:
    stats = service.model_statistics("bat")[0]
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


def test_packed_and_core_way_requests_share_batches_where_their_shapes_agree(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        answers: list[Any] = []
        try:
            four, five = np.ones((1, 4), np.float32), np.ones((1, 5), np.float32)
            # in queue order, as Triton takes them: four [1, 4] (one the core's way) fill a
            # batch at once; then a [1, 5] of each way, ended by a [1, 6] that cannot join them
            _packed(link, staging, 1, four)
            service.start_infer(_request(four), lambda r, e: answers.append((r, e)))
            _packed(link, staging, 2, four)
            _packed(link, staging, 3, four * 3)
            _packed(link, staging, 4, five)
            service.start_infer(_request(five), lambda r, e: answers.append((r, e)))
            _packed(link, staging, 5, np.ones((1, 6), np.float32))
            await _until(lambda: len(frames.of_kind(wire.OK)) == 4, "the two batches")
            await _until(lambda: len(answers) == 2, "the core's answers")
            assert _batches(service) == {4: 1, 2: 1}
            # the [1, 6] waits out the delay alone
            await _until(lambda: len(frames.of_kind(wire.OK)) == 5, "the delayed batch")
            assert _batches(service) == {4: 1, 2: 1, 1: 1}
            for response, error in answers:
                assert error is None and response is not None
                response.release()
            stats = service.model_statistics("bat")[0]
            assert (stats.inference_count, stats.execution_count) == (7, 3)
            assert stats.inference_stats.success.count == 7
            assert link.arena is not None and not link.calls
        finally:
            await _close(service, link, staging)

    asyncio.run(run())


def test_a_packed_request_s_queue_timeout_is_the_batcher_s_error(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            (block,) = _packed(link, staging, 7, np.ones((1, 3000), np.float32), timeout=1000)
            await _until(lambda: frames.of_kind(wire.ERROR), "no error")
            (error,) = frames.of_kind(wire.ERROR)
            assert error[1] == 7 and "Request timeout expired" in str(error)
            await _until(lambda: _freed(frames), "the block never came back")
            assert _freed(frames) == [block.segment, block.offset, block.nbytes]
            stats = service.model_statistics("bat")[0]
            assert stats.inference_stats.fail.count == 1 and stats.execution_count == 0
        finally:
            await _close(service, link, staging)

    asyncio.run(run())


def test_a_cancelled_queued_packed_call_gives_its_block_back(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            blocks = [_packed(link, staging, i, np.ones((1, 3000), np.float32))[0] for i in (1, 2)]
            link.on_call([wire.CANCEL, 2], [])  # queued: the batcher waits out its delay
            await _until(lambda: frames.of_kind(wire.OK), "no answer")
            flat = [n for b in blocks for n in (b.segment, b.offset, b.nbytes)]
            await _until(lambda: sorted(_freed(frames)) == sorted(flat), "blocks not back")
            assert [h[1] for h in frames.of_kind(wire.OK)] == [1]
            assert _batches(service) == {1: 1}
            assert link.arena is not None and link.arena.held == 0 and not link.calls
        finally:
            await _close(service, link, staging)

    asyncio.run(run())
