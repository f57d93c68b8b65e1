"""Lent output blocks: carried by descriptor, given back once the model and response are done."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from shoal.ipc.arena import OwnedArena
from shoal.stub import pb_utils
from shoal.stub.lent_outputs import OutputLender
from shoal.stub.memory import Locations, SharedOutputArena
from shoal.stub.tensors_out import TensorWriter


@pytest.fixture
def writer():
    arena = OwnedArena(7, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20)
    outputs = SharedOutputArena(arena)
    writer = TensorWriter(outputs, Locations())
    writer.lender = OutputLender(outputs, writer.locations)
    pb_utils._set_output_lender(writer.lender.lend)
    yield writer
    pb_utils._set_output_lender(None)
    arena.close()


def test_a_lent_output_is_carried_without_a_copy_and_freed_by_the_last_holder(writer):
    arena = writer.outputs.arena
    tensor = pb_utils.empty_output_tensor("OUT", [4, 8], np.float32)
    array = tensor.as_numpy()
    array[:] = 3.0
    used = arena.used_bytes
    written: list = []
    desc = writer.describe(tensor, written, for_response=True)
    assert arena.used_bytes == used  # no new block: the response carries the lent one
    assert desc.name == "OUT" and desc.shape == (4, 8) and desc.datatype == "FP32"
    assert np.frombuffer(writer.outputs.view(desc.location), np.float32).tolist() == [3.0] * 32
    # A second output of the same array is a copy: one response owns the block.
    again = writer.describe(pb_utils.Tensor("AGAIN", array), written, for_response=True)
    assert again.location != desc.location and arena.used_bytes > used
    writer.outputs.free([again.location])
    # The supervisor gives the block back, but the model still holds the array: kept.
    assert writer.lender.released([desc.location]) == []
    assert writer.lender.lent_count == 1
    del tensor, array
    gc.collect()
    assert writer.lender.lent_count == 0
    assert arena.used_bytes == 0


def test_an_unsent_or_dropped_loan_goes_back(writer):
    arena = writer.outputs.arena
    tensor = pb_utils.empty_output_tensor("OUT", [16], np.int32)
    written: list = []
    writer.describe(tensor, written, for_response=True)
    writer.free(written)  # the response failed: the block is the model's alone again
    assert writer.lender.lent_count == 1
    del tensor
    gc.collect()
    assert arena.used_bytes == 0 and writer.lender.lent_count == 0
    # Lent and never returned: the array's end gives it back.
    pb_utils.empty_output_tensor("OUT", [16], np.int32)
    gc.collect()
    assert arena.used_bytes == 0


def test_a_model_that_does_not_ask_is_unaffected(writer):
    arena = writer.outputs.arena
    written: list = []
    desc = writer.describe(
        pb_utils.Tensor("OUT", np.ones(8, np.float32)), written, for_response=True
    )
    assert written == [desc.location] and arena.used_bytes > 0
    assert writer.lender.released([desc.location]) == [desc.location]  # freed as always
