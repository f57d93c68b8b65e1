"""A packed record's head written piece by piece is, byte for byte, what msgpack's Packer
makes of the same fields."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.frontends.workers import head_bytes as hb
from shoal.frontends.workers import packing
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.ipc.arena import OwnedArena
from shoal.ipc.tensor import Block, InlineBytes, TensorDesc
from shoal.supervisor.requests import packed
from tests.unit.frontends.workers.test_packing import BATCHED, SLOT, UNBATCHED, _summary

pytestmark = pytest.mark.timeout(60)

#: Each boundary of msgpack's integer forms, and its neighbours.
EDGES = [0, 1, 2, 31, 32, 33, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
INTEGERS = sorted({n + d for n in EDGES for d in (-1, 0, 1) if 0 <= n + d < 2**64})
INTEGERS += [-n for n in (1, 31, 32, 33, 127, 128, 129, 32768, 32769, 2**31, 2**31 + 1, 2**63)]


def _packed(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@pytest.mark.parametrize("value", INTEGERS)
def test_an_integer_is_the_packer_s(value: int) -> None:
    assert hb.int_bytes(value) == _packed(value)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_an_integer_past_64_bits_is_refused_as_by_the_packer(value: int) -> None:
    with pytest.raises(OverflowError):
        _packed(value)
    with pytest.raises(OverflowError):
        hb.int_bytes(value)


@pytest.mark.parametrize("size", [0, 1, 31, 32, 255, 256, 65535, 65536])
@pytest.mark.parametrize("char", ["a", "é"])
def test_a_str_and_an_array_are_the_packer_s(size: int, char: str) -> None:
    text = (char * size)[:size] if char == "a" else char * (size // 2)
    assert hb.str_bytes(text) == _packed(text)
    texts = [str(i) for i in range(min(size, 300))]
    assert hb.array_of_str(texts) == _packed(texts)
    assert hb.array_header(size) == _packed([0] * size)[: len(hb.array_header(size))]


def test_a_lone_surrogate_is_refused_as_by_the_packer() -> None:
    with pytest.raises(UnicodeEncodeError):
        _packed("x\udc00")
    with pytest.raises(UnicodeEncodeError):
        hb.str_bytes("x\udc00")


@pytest.mark.parametrize("nbytes", [0, 1, 255, 256, 65535, 65536])
def test_a_descriptor_is_the_packer_s(nbytes: int) -> None:
    rng = random.Random(nbytes)
    name_type = hb.str_bytes("INPUT0") + hb.str_bytes("UINT8")
    for shape in [(), (nbytes,), (1, 16), (2, 300, 70_000, 1 << 40, 0)]:
        data = rng.randbytes(nbytes)
        block = Block(7, 3, rng.choice([0, 200, 1 << 33]), nbytes)
        for location in (InlineBytes(data), block):
            wire = TensorDesc("INPUT0", "UINT8", shape, location).to_wire()
            assert hb.desc_bytes(name_type, hb.shape_bytes(shape), location) == _packed(wire)


def _old_head(request: InferRequest, snapshot: Snapshot, prepared: packing.Prepared) -> bytes:
    """The head as the Packer made it: the seven fields packed as one array, its header then
    saying eleven."""
    descs = []
    for tensor, block in zip(request.inputs, prepared.staged, strict=True):
        rule = snapshot.inputs[tensor.name]
        shape = packing._model_shape(snapshot, rule, tensor.shape)
        location = block if block is not None else InlineBytes(bytes(tensor.data))
        descs.append(TensorDesc(tensor.name, tensor.datatype, shape, location).to_wire())
    outputs = [o.name for o in request.outputs] if request.outputs else snapshot.outputs
    timeout = packing._timeout(request)
    fields = [request.id, 0, 0, request.parameters, outputs, descs, timeout]
    return b"\x9b" + _packed(fields)[1:]


def _fp32(name: str, shape: tuple[int, ...]) -> InferInput:
    return InferInput(name, "FP32", shape, np.ones(shape, np.float32).tobytes())


CASES = [
    ("m", [_fp32("A", (1, 2))], [], "", None),
    ("m", [_fp32("A", (3, 2))], ["Z", "Y"], "r-1", None),
    ("m", [_fp32("A", (3, 2))], ["Y", "Z"], "", None),  # every output, in the model's order
    ("m", [_fp32("A", (3, 2))], ["Y"], "", None),
    ("m", [_fp32("A", (2, 2))], [], "an id of more than thirty-one characters", {"k": "v"}),
    (
        "m",
        [
            InferInput("R", "INT32", (2, 4), np.arange(8, dtype=np.int32).tobytes()),
            _fp32("A", (2, 2)),
        ],
        [],
        "",
        {"timeout": 500, "f": 1.5, "b": True},
    ),
    ("n", [InferInput("X", "UINT8", (5000,), bytes(range(250)) * 20)], [], "x", None),
    ("n", [InferInput("X", "UINT8", (40,), b"\x07" * 40)], ["Y"], "", {"timeout": 70_000}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_request_s_head_is_the_packer_s(tmp_path, case: int) -> None:
    model, inputs, outputs, request_id, parameters = CASES[case]
    text = BATCHED if model == "m" else UNBATCHED
    snapshot = Snapshot(packed.snapshot(_summary(tmp_path, text), SLOT))
    request = InferRequest(
        model, "", request_id, inputs, [RequestedOutput(n, {}) for n in outputs], parameters
    )
    arena = OwnedArena(1 << 32, initial_bytes=1 << 20)
    try:

        def stage(view: memoryview) -> Block:
            block = arena.allocate(view.nbytes)
            arena.view(block)[:] = view
            return block

        prepared = prepare(request, snapshot, stage)
        assert prepared is not None and prepared.packed
        assert prepared.head == _old_head(request, snapshot, prepared)
    finally:
        arena.close()


def test_heads_of_one_snapshot_follow_each_request_s_shape(tmp_path) -> None:
    """An input's last shape is remembered: a request of another shape, and the one after it,
    still have the Packer's head."""
    snapshot = Snapshot(packed.snapshot(_summary(tmp_path, BATCHED), SLOT))
    for rows in (1, 1, 3, 1, 2, 2):
        request = InferRequest("m", "", "", [_fp32("A", (rows, 2))], [], None)
        prepared = prepare(request, snapshot, None)
        assert prepared is not None and prepared.packed
        assert prepared.head == _old_head(request, snapshot, prepared)
