"""When a BLS call's outputs are given back (``BlsDone``): at once outside an execute; during a
sync execute together with the model's next call, or at the end of the execute."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.tensor import TensorDesc
from shoal.stub import pb_utils
from shoal.stub.bls import BlsClient
from shoal.stub.memory import Locations, SharedOutputArena
from shoal.stub.tensors_out import TensorWriter

pytestmark = pytest.mark.timeout(30)


class _Pump:
    """Answers every call at once with one FP32 output in a block of its own."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def new_call_id(self) -> int:
        return next(self._ids)

    def expect(self, call_id: int) -> None:
        pass

    def forget(self, call_id: int) -> None:
        pass

    def next_reply(self, call_id: int) -> msg.BlsReply:
        out = TensorDesc("OUTPUT0", "FP32", (4,), Block(9, 0, 16 * call_id, 16))
        return msg.BlsReply(call_id, msg.ResponseRecord(outputs=[out]), True)


@pytest.fixture
def client():
    arena = OwnedArena(5, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 16)
    memory = bytearray(4096)
    sent: list[msg.Message] = []
    bls = BlsClient(
        TensorWriter(SharedOutputArena(arena), Locations()),
        _Pump(),  # type: ignore[arg-type]
        sent.append,
        lambda block: memoryview(memory)[block.offset : block.offset + block.nbytes],
    )
    pb_utils._set_bls_executor(bls)
    yield bls, sent
    arena.close()


def _call():
    return pb_utils.InferenceRequest(
        model_name="add_sub",
        inputs=[pb_utils.Tensor("INPUT0", np.ones(4, dtype=np.float32))],
        requested_output_names=["OUTPUT0"],
    ).exec()


def _sent(sent):
    return [(type(m).__name__, m.call_id) for m in sent]


def test_outside_an_execute_a_dropped_call_is_given_back_at_once(client):
    _, sent = client
    response = _call()
    assert _sent(sent) == [("BlsCall", 1)]
    del response
    assert _sent(sent) == [("BlsCall", 1), ("BlsDone", 1)]


def test_during_an_execute_it_goes_up_with_the_next_call_or_at_the_end(client):
    bls, sent = client
    with bls.batching_done():
        first = _call()
        del first
        assert _sent(sent) == [("BlsCall", 1)]
        second = _call()
        assert _sent(sent) == [("BlsCall", 1), ("BlsDone", 1), ("BlsCall", 2)]
        del second
        assert _sent(sent)[-1] == ("BlsCall", 2)
    assert _sent(sent)[-1] == ("BlsDone", 2)


def test_a_call_dropped_on_another_thread_is_given_back_at_once(client):
    bls, sent = client
    with bls.batching_done():
        holder = [_call()]
        thread = threading.Thread(target=holder.clear)
        thread.start()
        thread.join()
        assert _sent(sent) == [("BlsCall", 1), ("BlsDone", 1)]
