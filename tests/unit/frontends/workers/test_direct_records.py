"""The Execute a frontend worker writes into a stub's ring for one packed request."""

from __future__ import annotations

import pytest

from shoal.core.types import InferInput, InferRequest
from shoal.frontends.workers.direct_records import direct_fits, execute_payload, private_inputs
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.ipc.tensor import Block, InlineBytes
from shoal.supervisor.requests import packed
from tests.unit.frontends.workers.test_packing import SLOT, UNBATCHED, _req, _summary

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def arena():
    made = OwnedArena(1 << 32, initial_bytes=1 << 20)
    yield made
    made.close()


def _execute(tmp_path, arena: OwnedArena, large: bytes, small: bytes, batch: int) -> msg.Execute:
    request = _req(
        "n",
        InferInput("X", "UINT8", (len(large),), large),
        InferInput("O", "INT64", (4,), small),
    )

    def stage(view: memoryview) -> Block:
        block = arena.allocate(view.nbytes)
        arena.view(block)[:] = view
        return block

    prepared = prepare(
        request, Snapshot(packed.snapshot(_summary(tmp_path, UNBATCHED), SLOT)), stage
    )
    assert prepared is not None and prepared.fields is not None
    private = private_inputs(prepared.staged)
    decoded = msg.decode(execute_payload(batch, prepared.head, private))
    assert isinstance(decoded, msg.Execute)
    return decoded


@pytest.mark.parametrize("batch", [1, (3 << 40) | 5])
def test_a_staged_input_is_named_by_its_block_and_is_the_model_s_to_write(tmp_path, arena, batch):
    large, small = bytes(range(256)) * 40, b"\x02" * 32
    execute = _execute(tmp_path, arena, large, small, batch)
    assert execute.batch_id == batch
    (record,) = execute.requests
    assert record.key == batch
    x, o = record.inputs
    assert isinstance(x.location, Block) and bytes(arena.view(x.location)) == large
    assert o.location == InlineBytes(small)
    assert record.private_inputs == 0b01
    assert (record.output_regions, record.trace_context) == ({}, "")


def test_an_all_inline_request_has_no_private_input(tmp_path, arena):
    execute = _execute(tmp_path, arena, b"\x01" * 100, b"\x02" * 32, 9)
    (record,) = execute.requests
    assert all(isinstance(t.location, InlineBytes) for t in record.inputs)
    assert record.private_inputs == 0


def test_a_request_with_a_timeout_takes_the_core_s_way():
    assert direct_fits(InferRequest("n", "", "", []))
    assert direct_fits(InferRequest("n", "", "", [], parameters={"priority": 1}))
    assert not direct_fits(InferRequest("n", "", "", [], parameters={"timeout": 1000}))
