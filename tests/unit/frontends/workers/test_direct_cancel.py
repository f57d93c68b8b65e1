"""A direct request whose client goes away: the stub hears a Cancel, or, where the Result came
in the same loop turn as the cancel, the Result's blocks and the request's inputs go back."""

from __future__ import annotations

import asyncio
import os

import pytest

from shoal.core.types import InferRequest
from shoal.frontends.workers.direct import DirectDispatch
from shoal.frontends.workers.direct_stubs import Route, Stub
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.queue import Channel
from shoal.ipc.stat_counters import CounterRows
from shoal.ipc.tensor import TensorDesc

pytestmark = pytest.mark.timeout(10)

WORKER_ARENA = 7
STUB_ARENA = 3


class InputBlocks:
    """The worker's input arena as direct dispatch uses it: the blocks it frees, kept."""

    arena_id = WORKER_ARENA

    def __init__(self) -> None:
        self.freed: list[Block] = []

    def view(self, block: Block) -> memoryview:
        raise AssertionError("no response is written here")

    def free_blocks(self, blocks: list[Block]) -> None:
        self.freed.extend(blocks)


def _cancelled_answer(result_first: bool) -> tuple[list[msg.Message], list[Block]]:
    """Run DirectDispatch._answer for one request and cancel it; with ``result_first`` its
    Result is set in the same turn, before the cancel. What the stub heard, and the inputs the
    worker's arena got back."""
    channel = Channel.create(4096)
    counters = CounterRows.create()
    try:
        arena = InputBlocks()
        dispatch = DirectDispatch(0, lambda *a: None, None, lambda f: None, arena, counters.fd)  # type: ignore[arg-type]
        stub = Stub(os.getpid(), "identity_0", channel, None)
        route = Route(0, 0, "identity", [stub], 0, 0)
        inputs = [Block(WORKER_ARENA, 0, 0, 64)]
        output = TensorDesc("OUT", "FP32", (16,), Block(STUB_ARENA, 0, 128, 64))
        result = msg.Result(5, [msg.ResponseRecord([output])])

        async def run() -> None:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[msg.Result] = loop.create_future()
            request = InferRequest(model_name="identity", inputs=[])
            task = loop.create_task(dispatch._answer(stub, route, 5, request, inputs, future))  # type: ignore[arg-type]
            await asyncio.sleep(0)  # it awaits its Result
            if result_first:
                future.set_result(result)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert route.in_flight == 0

        asyncio.run(run())
        heard = []
        while (payload := channel.recv_down_nowait()) is not None:
            heard.append(msg.decode(payload))
        return heard, arena.freed
    finally:
        channel.close()
        os.close(counters.fd)


def test_a_cancelled_request_tells_its_stub() -> None:
    heard, freed = _cancelled_answer(result_first=False)
    assert heard == [msg.Cancel([5])]
    assert freed == []  # its Result, when it comes, gives them back


def test_a_result_come_in_the_cancels_turn_gives_its_blocks_back() -> None:
    heard, freed = _cancelled_answer(result_first=True)
    assert heard == [msg.Release([Block(STUB_ARENA, 0, 128, 64)])]
    assert freed == [Block(WORKER_ARENA, 0, 0, 64)]
