"""The relay's request side: what a worker checks and packs against its snapshot of a model's
summary is what the core would check and pack itself."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.config import load_model_config
from shoal.core.errors import ShoalError
from shoal.core.packed import PackedCall, frame
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.frontends.workers import packing
from shoal.frontends.workers import snapshots as snapshots_module
from shoal.frontends.workers.packing import Snapshot, Snapshots, prepare
from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.ipc.dtypes import serialize_bytes
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import Block, InlineBytes
from shoal.supervisor.requests import packed, staging
from shoal.supervisor.requests.summary import ModelSummary

pytestmark = pytest.mark.timeout(30)

#: The slot the core numbered the snapshots' model version with.
SLOT = 3

BATCHED = """
name: "m"
backend: "python"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "R" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } optional: true }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] }
]
"""

UNBATCHED = """
name: "n"
backend: "python"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_UINT8 dims: [ -1 ] },
  { name: "O" data_type: TYPE_INT64 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } optional: true }
]
output [ { name: "Y" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""


def _summary(tmp_path, text: str) -> ModelSummary:
    model = tmp_path / text.split('"')[1]
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text(text)
    return ModelSummary(load_model_config(model))


def _fp32(name, shape):
    return InferInput(name, "FP32", tuple(shape), np.ones(shape, np.float32).tobytes())


def _req(model, *inputs, outputs=(), id="", parameters=None, output_params=None):
    requested = [RequestedOutput(n, dict(output_params or {})) for n in outputs]
    return InferRequest(model, "", id, list(inputs), requested, parameters)


STRINGS = serialize_bytes(np.array([b"ab", b"c"], dtype=np.object_))
INTS = np.arange(8, dtype=np.int32).tobytes()

#: Requests for model "m" (batched): (request, whether the relay takes it).
BATCHED_CASES = [
    (_req("m", _fp32("A", (1, 2))), True),
    (_req("m", _fp32("A", (3, 2)), outputs=["Z", "Y"], id="r-1"), True),
    (
        _req(
            "m",
            InferInput("R", "INT32", (2, 4), INTS),
            InferInput("S", "BYTES", (2, 1), STRINGS),
            _fp32("A", (2, 2)),
            parameters={"timeout": 500, "k": "v", "f": 1.5, "b": True},
        ),
        True,
    ),
    (_req("m", _fp32("A", (0, 2))), True),  # an empty batch matches
    (_req("m", InferInput("A", "FP32", (1, 2), memoryview(np.ones((1, 2), np.float32)))), True),
    # the core's errors: never relayed
    (_req("m", _fp32("B", (1, 2))), False),
    (_req("m"), False),
    (_req("m", InferInput("A", "INT32", (1, 2), b"\0" * 8)), False),
    (_req("m", _fp32("A", (1, 3))), False),
    (_req("m", _fp32("A", (2,))), False),
    (_req("m", _fp32("A", (9, 2))), False),
    (_req("m", _fp32("A", (1, 2)), _fp32("A", (1, 2))), False),
    (_req("m", InferInput("A", "FP32", (1, -2), b"")), False),
    (_req("m", InferInput("A", "FP32", (1 << 30, 0, 1 << 30), b"")), False),
    (_req("m", InferInput("A", "FP32", (1, 2), b"\0" * 7)), False),
    (_req("m", _fp32("A", (1, 2)), InferInput("S", "BYTES", (1, 3), STRINGS)), False),
    (_req("m", _fp32("A", (1, 2)), outputs=["W"]), False),
    (_req("m", _fp32("A", (1, 2)), outputs=["Z", "Y", "Z"]), False),  # an output named twice
    (_req("m", _fp32("A", (1, 2)), id="bad\udc00"), False),
    (_req("m", _fp32("A", (1, 2)), parameters={"x\udc00": 1}), False),
    (_req("m", _fp32("A", (1, 2)), parameters={"x": "\udc00"}), False),
    # valid, but the core's to handle: sequence fields, odd timeouts, shared memory, classes
    (_req("m", _fp32("A", (1, 2)), parameters={"sequence_id": 5}), False),
    (_req("m", _fp32("A", (1, 2)), parameters={"timeout": "5"}), False),
    (_req("m", _fp32("A", (1, 2)), parameters={"timeout": True}), False),
    (_req("m", _fp32("A", (1, 2)), outputs=["Y"], output_params={"classification": 2}), False),
    (
        _req("m", InferInput("A", "FP32", (1, 2), b"", {"shared_memory_region": "r"})),
        False,
    ),
    (_req("m", InferInput("A", "FP32", (1, 2), np.ones((1, 2), np.float32))), False),
]


def _core_verdict(summary: ModelSummary, request: InferRequest, arena: OwnedArena):
    """The core's record of ``request`` (staged in ``arena``), or its error."""
    try:
        outputs = staging.check_outputs(summary, request)
        staging.check_inputs(summary, request)
        record, blocks = staging.stage_request(summary, request, arena, outputs)
    except ShoalError as error:
        return error
    for block in blocks:
        arena.free(block)
    return record


def _call(prepared: packing.Prepared, call_id: int = 5) -> PackedCall:
    """The call as the core reads it from the worker's frame."""
    assert prepared.fields is not None
    _, *header, head = frame(call_id, prepared.fields, prepared.head)
    read = b"".join(header)
    return PackedCall(read, 0, len(read), head)


def _relayed_record(prepared: packing.Prepared, key: int) -> RequestRecord:
    record = packed.record(_call(prepared), "")
    record.key = key
    return record


@pytest.fixture
def arena():
    with OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20) as a:
        yield a


@pytest.mark.parametrize(("request_", "relays"), BATCHED_CASES)
def test_the_worker_relays_what_the_core_accepts_and_packs_it_the_same(
    tmp_path, arena, request_, relays
):
    summary = _summary(tmp_path, BATCHED)
    snapshot = Snapshot(packed.snapshot(summary, SLOT))
    core = _core_verdict(summary, request_, arena)
    prepared = prepare(request_, snapshot, None)
    if not relays:
        assert prepared is None
        return
    assert isinstance(core, RequestRecord), core  # the relay takes nothing the core refuses
    assert prepared is not None and prepared.fields is not None
    for key, trace in ((41, ""), (1 << 40, "ctx")):
        core.key, core.trace_context = key, trace
        spliced = _relayed_record(prepared, key)
        spliced.trace_context = trace
        # the Execute a stub reads is the same byte for byte, alone or beside a record packed
        # the core's way
        assert msg.encode(msg.Execute(3, [spliced])) == msg.encode(msg.Execute(3, [core]))
        both = msg.Execute(1 << 40, [core, spliced, core])
        assert msg.encode(both) == msg.encode(msg.Execute(1 << 40, [core, core, core]))
    call = _call(prepared)
    assert (call.call_id, call.slot, call.generation) == (5, SLOT, summary.generation)
    assert call.request_id == request_.id
    assert call.batch_size == staging.batch_size(summary, request_)
    assert (call.timeout_us, call.private_inputs, call.numbers) == (
        core.timeout_us,
        core.private_inputs,
        [],
    )


def test_a_batch_of_many_records_keeps_its_array_header(tmp_path):
    summary = _summary(tmp_path, BATCHED)
    prepared = prepare(
        _req("m", _fp32("A", (1, 2))), Snapshot(packed.snapshot(summary, SLOT)), None
    )
    assert prepared is not None
    records = [_relayed_record(prepared, key) for key in range(1, 21)]
    decoded = msg.decode(msg.encode(msg.Execute(9, records)))
    assert isinstance(decoded, msg.Execute) and decoded.batch_id == 9
    assert [r.key for r in decoded.requests] == list(range(1, 21))
    assert all(r.inputs[0].location == InlineBytes(b"\0\0\x80?" * 2) for r in decoded.requests)


def test_inputs_past_the_inline_budget_go_in_worker_blocks(tmp_path, arena):
    summary = _summary(tmp_path, UNBATCHED)
    small, large = b"\x01" * 100, bytes(range(256)) * 40  # 10,240 bytes: past 4 KiB
    request = _req(
        "n",
        InferInput("X", "UINT8", (len(large),), large),
        InferInput("O", "INT64", (4,), small[:32]),
    )
    placed: list[Block] = []

    def stage(view: memoryview) -> Block:
        block = arena.allocate(view.nbytes)
        arena.view(block)[:] = view
        placed.append(block)
        return block

    prepared = prepare(request, Snapshot(packed.snapshot(summary, SLOT)), stage)
    assert prepared is not None and prepared.fields is not None
    assert prepared.staged == [placed[0], None]
    call = _call(prepared)
    assert call.private_inputs == 0b01
    assert call.numbers == [placed[0].segment, placed[0].offset, len(large)]
    decoded = msg.decode(msg.encode(msg.Execute(1, [_relayed_record(prepared, 7)])))
    x, o = decoded.requests[0].inputs
    assert (x.name, x.shape, x.location) == ("X", (len(large),), placed[0])
    assert bytes(arena.view(x.location)) == large
    assert (o.name, o.shape, o.location) == ("O", (2, 2), InlineBytes(small[:32]))
    assert decoded.requests[0].private_inputs == 0b01


def test_a_full_arena_hands_what_it_staged_to_the_core_s_path(tmp_path):
    summary = _summary(tmp_path, UNBATCHED)
    data = b"\x02" * 5000
    request = _req("n", InferInput("X", "UINT8", (5000,), data))
    prepared = prepare(request, Snapshot(packed.snapshot(summary, SLOT)), lambda view: None)
    assert prepared is not None and prepared.fields is None and prepared.staged == [None]
    # no arena at all: only inline inputs relay
    assert prepare(request, Snapshot(packed.snapshot(summary, SLOT)), None).fields is None


def test_snapshots_are_asked_once_and_dropped_when_stale(monkeypatch):
    asked: list[tuple[str, str]] = []
    plain = [7, "m", 0, 16384, [["X", "UINT8", [-1], None]], ["X"], ["Y"], [], [], False, 0]

    def ask(name: str, version: str):
        asked.append((name, version))
        return plain if name == "m" else None

    snapshots = Snapshots(ask)
    first = snapshots.get("m", "")
    assert first is not None and first.generation == 7
    assert snapshots.get("m", "") is first and asked == [("m", "")]
    snapshots.drop("m", "")
    assert snapshots.get("m", "") is not first and asked == [("m", "")] * 2
    # a model without one is asked about again only after a while
    assert snapshots.get("none", "") is None and snapshots.get("none", "") is None
    assert asked.count(("none", "")) == 1
    now = snapshots_module.time.monotonic()
    monkeypatch.setattr(snapshots_module.time, "monotonic", lambda: now + 60)
    assert snapshots.get("none", "") is None and asked.count(("none", "")) == 2


def test_the_worker_s_element_limit_is_the_core_s():
    assert packing.MAX_ELEMENTS == staging.MAX_ELEMENTS


def test_a_resend_places_each_staged_input_in_its_block():
    staged = [Block(1 << 32, 0, 64, 5000), None, Block(1 << 32, 0, 8192, 9000)]
    placed: list[int] = []

    def place(view: memoryview) -> Block | None:
        placed.append(view.nbytes)
        return None

    restage = packing.Restage(staged, place)
    views = [memoryview(bytes(n)) for n in (5000, 10, 9000, 20)]
    assert [restage(v) for v in views] == [staged[0], None, staged[2], None]
    assert placed == [10, 20]  # only the inputs the relay did not place
