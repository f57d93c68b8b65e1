"""A relayed answer's frame (``answer_frames.send_record``) decodes into the response the core
would have made from the stub's record: every datatype, inline and block outputs, outputs the
worker reads in place, the layout packed once, and errors."""

from __future__ import annotations

import os
from typing import Any

import pytest

from shoal.core.types import InferOutput, InferResponse
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers import answer_frames as frames
from shoal.ipc.arena import Block
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import CudaLocation, InlineBytes, RegionLocation, TensorDesc

pytestmark = pytest.mark.timeout(10)

DATATYPES = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
    "BYTES": 1,
}


class _Done:
    """A completion as the core relays it: the record, its blocks' bytes, released once."""

    def __init__(self, record: ResponseRecord, blocks: dict[Any, bytes] | None = None) -> None:
        self.response = record
        self.blocks = blocks or {}
        self.released = 0

    def view(self, block: Block | CudaLocation) -> memoryview:
        return memoryview(self.blocks[_key(block)])

    def release(self) -> None:
        self.released += 1


def _key(block: Block | CudaLocation) -> Any:
    return (block.segment, block.offset) if type(block) is Block else block.device


class _Sent:
    """The frames ``send`` was given, read back as the worker reads them."""

    def __init__(self) -> None:
        self.frames: list[tuple[list[Any], list[memoryview]]] = []

    def __call__(self, header: list[Any], payloads: Any) -> None:
        data = b"".join(bytes(p) for p in wire.frame(header, payloads))
        size, _ = wire.prefix(data)
        start = wire.PREFIX_SIZE + size
        self.frames.append(wire.split(data[wire.PREFIX_SIZE : start], memoryview(data)[start:]))


def _made(model: str, version: str, request_id: str, done: _Done) -> InferResponse:
    """The response the core made from the record before the relay (``_wire`` round trip)."""
    outputs = []
    for t in done.response.outputs:
        location = t.location
        data = location.data if type(location) is InlineBytes else done.view(location)
        outputs.append(InferOutput(t.name, t.datatype, t.shape, data, {}))
    response = InferResponse(model, version, request_id, outputs, done.response.parameters)
    payloads: list[memoryview | bytes] = []
    fields = response_wire.response_to_wire(response, payloads)
    return response_wire.response_from_wire(fields, [memoryview(bytes(p)) for p in payloads])


def _same(a: InferResponse, b: InferResponse) -> None:
    assert (a.model_name, a.model_version, a.id, a.parameters, a.final, a.error) == (
        b.model_name,
        b.model_version,
        b.id,
        b.parameters,
        b.final,
        b.error,
    )
    assert [(o.name, o.datatype, o.shape, o.parameters, bytes(o.data)) for o in a.outputs] == [
        (o.name, o.datatype, o.shape, o.parameters, bytes(o.data)) for o in b.outputs
    ]


def _relayed(done: _Done, model: str = "m", version: str = "1", request_id: str = "r") -> Any:
    sent = _Sent()
    frames.send_record(sent, None, 7, (model, version, request_id), done)
    ((header, payloads),) = sent.frames
    return header, payloads


def test_every_datatype_inline_and_in_blocks_decodes_as_the_response_made_before():
    outputs, blocks = [], {}
    for i, (datatype, size) in enumerate(DATATYPES.items()):
        inline = InlineBytes(os.urandom(3 * size))
        block = Block(0, 1, 64 * i, 5 * size)
        blocks[_key(block)] = os.urandom(5 * size)
        outputs.append(TensorDesc(f"I_{datatype}", datatype, (3,), inline))
        outputs.append(TensorDesc(f"B_{datatype}", datatype, (1, 5), block))
    outputs.append(TensorDesc("GPU", "FP32", (2,), CudaLocation(0, 0, 8)))
    blocks[0] = os.urandom(8)
    outputs.append(TensorDesc("EMPTY", "FP32", (0, 4), InlineBytes(b"")))
    done = _Done(ResponseRecord(outputs, None, {"sequence_end": True, "n": 3}), blocks)
    header, payloads = _relayed(done, "model", "2", "id-1")
    assert header[:2] == [wire.OK, 7] and type(header[2]) is bytes
    assert done.released == 1  # copied into the frame: released at once
    back = response_wire.response_from_wire(header[2:], payloads)
    _same(back, _made("model", "2", "id-1", done))
    assert back.final is True and back.error is None and back._release is None


def test_outputs_the_worker_reads_in_place_are_described_and_leased():
    big = Block(3, 2, 4096, 16)
    small = InlineBytes(b"xy")
    done = _Done(ResponseRecord([TensorDesc("A", "UINT8", (2,), small)] * 2), {})
    done.response.outputs.insert(1, TensorDesc("B", "INT32", (4,), big))
    done.blocks[_key(big)] = bytes(range(16))
    out: list[memoryview | bytes] = []
    fields = frames.record_to_wire("m", "1", "r", done, out, lambda b: [b.arena_id, b.segment])
    assert fields[3] == [None, [3, 2], None] and fields[-1] == 0
    assert out == [b"xy", b"xy"]  # the described block is not in the frame
    fields[-1] = 9
    viewed, released = [], []

    def view(where: list[int]) -> memoryview:
        viewed.append(where)
        return memoryview(bytes(range(16)))

    back = response_wire.response_from_wire(
        fields, [memoryview(p) for p in out], view, released.append
    )
    assert viewed == [[3, 2]]
    assert [(o.name, bytes(o.data)) for o in back.outputs] == [
        ("A", b"xy"),
        ("B", bytes(range(16))),
        ("A", b"xy"),
    ]
    back.release()
    assert released == [9]
    with pytest.raises(ValueError, match="output 'B' lies in shared memory"):
        response_wire.response_from_wire(fields, [memoryview(p) for p in out])


def test_the_layout_is_packed_once_per_model_version_and_outputs():
    def outputs(*pairs: tuple[str, str]) -> list[TensorDesc]:
        return [TensorDesc(n, d, (1,), InlineBytes(b"\0")) for n, d in pairs]

    first = frames.layout("lay", "1", outputs(("Y", "FP32"), ("Z", "INT8")))
    assert frames.layout("lay", "1", outputs(("Y", "FP32"), ("Z", "INT8"))) is first
    others = [
        frames.layout("lay", "2", outputs(("Y", "FP32"), ("Z", "INT8"))),
        frames.layout("lay", "2", outputs(("Y", "FP32"))),
        frames.layout("lay", "2", outputs(("Y", "FP32"), ("Z", "INT16"))),
        frames.layout("lay", "2", outputs(("Y", "FP32"), ("W", "INT16"))),
        frames.layout("lay", "2", []),
    ]
    assert len({first, *others}) == 6
    assert response_wire.layout_of(first) == ["lay", "1", ["Y", "Z"], ["FP32", "INT8"]]
    assert response_wire.layout_of(first) is response_wire.layout_of(
        bytes(first)
    )  # the worker decodes it once
    assert response_wire.layout_of(others[-1]) == ["lay", "2", [], []]


def test_client_strings_cross_as_they_are():
    odd = "r\udc80é"  # a lone surrogate JSON let in, and UTF-8
    done = _Done(ResponseRecord([TensorDesc("Ÿ\udc81", "BYTES", (1,), InlineBytes(b"a"))]))
    header, payloads = _relayed(done, "mödel", "1", odd)
    back = response_wire.response_from_wire(header[2:], payloads)
    assert back.id == odd and back.model_name == "mödel"
    assert back.outputs[0].name == "Ÿ\udc81"


def test_an_output_with_no_bytes_to_relay_is_the_calls_error_and_the_completion_goes():
    region = TensorDesc("Y", "FP32", (1,), RegionLocation("shm", 0, 4))
    done = _Done(ResponseRecord([region]))
    header, payloads = _relayed(done)
    assert header[:2] == [wire.ERROR, 7] and not payloads
    error = plain.error_from_wire(header[2])
    assert "output 'Y' has no bytes to relay" in str(error)
    assert done.released == 1
