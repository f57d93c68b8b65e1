"""A relayed answer that carries the stub's record undecoded (a whole Result's,
``ipc/whole_results.py``) decodes in the worker into the same response as the answer the core
builds from the decoded record (``answer_frames.send_record``, both kinds)."""

from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest

from shoal.core.types import InferResponse
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers import answer_frames as frames
from shoal.ipc import messages as msg
from shoal.ipc import whole_results
from shoal.ipc.arena import Block
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import INLINE_TENSOR_MAX, CudaLocation, InlineBytes, TensorDesc

pytestmark = pytest.mark.timeout(10)

SIZES = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4}
SIZES |= {"FP64": 8, "BF16": 2, "BYTES": 1, "UINT64": 8, "INT8": 1, "INT16": 2, "UINT32": 4}


class _Done:
    """A completion as the core relays it: its record, released once."""

    def __init__(self, record: ResponseRecord) -> None:
        self.response = record
        self.released = 0

    def view(self, block: Block | CudaLocation) -> memoryview:
        raise AssertionError("an inline record has no block to view")

    def release(self) -> None:
        self.released += 1


class _Sent:
    """The frames ``send`` was given, read back as the worker reads them."""

    def __init__(self, fail: bool = False) -> None:
        self.frames: list[tuple[list[Any], list[memoryview]]] = []
        self.fail = fail

    def __call__(self, header: list[Any], payloads: Any) -> None:
        if self.fail and header[0] == wire.OK:
            raise OSError("the link is gone")
        data = b"".join(bytes(p) for p in wire.frame(header, payloads))
        size, _ = wire.prefix(data)
        start = wire.PREFIX_SIZE + size
        self.frames.append(wire.split(data[wire.PREFIX_SIZE : start], memoryview(data)[start:]))


def _records() -> list[ResponseRecord]:
    every = [
        TensorDesc(f"O_{d}", d, (1, 3), InlineBytes(os.urandom(3 * n))) for d, n in SIZES.items()
    ]
    largest = InlineBytes(os.urandom(INLINE_TENSOR_MAX))
    return [
        ResponseRecord(every, None, {"sequence_end": True, "n": 3, "s": "é"}),
        ResponseRecord([TensorDesc("EMPTY", "FP32", (0, 4), InlineBytes(b""))]),
        ResponseRecord([TensorDesc("BIG", "UINT8", (INLINE_TENSOR_MAX,), largest)]),
        ResponseRecord([]),
    ]


def _answer(record: ResponseRecord, model: str = "m", version: str = "1") -> InferResponse:
    """What the worker decodes from ``send_record``'s frame for ``record``."""
    sent, done = _Sent(), _Done(record)
    frames.send_record(sent, None, 7, (model, version, "id-9"), done)
    assert done.released == 1
    ((header, payloads),) = sent.frames
    assert header[:2] == [wire.OK, 7]
    return response_wire.response_from_wire(header[2:], payloads)


def _wholes(records: list[ResponseRecord]) -> list[memoryview]:
    result = msg.decode(msg.encode(msg.Result(3, records, (1, 2, 3))))
    assert type(result) is msg.Result and result.wholes is not None
    return result.wholes


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


def test_the_worker_decodes_the_same_response_from_the_undecoded_record():
    records = _records()
    for record, whole in zip(records, _wholes(records), strict=True):
        undecoded = _answer(whole_results.relayed(whole), "model-é", "2")
        _same(undecoded, _answer(whole_results.response_of(whole), "model-é", "2"))
        _same(undecoded, _answer(record, "model-é", "2"))
        assert undecoded.final and undecoded.error is None


def test_the_answer_is_the_head_and_the_records_bytes():
    (whole,) = _wholes([_records()[0]])
    sent = _Sent()
    frames.send_record(sent, None, 5, ("m", "3", "r"), _Done(whole_results.relayed(whole)))
    ((header, payloads),) = sent.frames
    assert header == [wire.OK, 5, frames.head("m", "3"), "r"]
    assert [bytes(p) for p in payloads] == [bytes(whole)]
    assert msgpack.unpackb(frames.head("m", "3")) == ["m", "3"]
    assert frames.head("m", "3") is frames.head("m", "3")  # packed once per model version
    assert msgpack.unpackb(frames.head("m", "4")) == ["m", "4"]


def test_a_failed_send_is_the_calls_error_and_the_record_is_released_once():
    (whole,) = _wholes([_records()[1]])
    sent, done = _Sent(fail=True), _Done(whole_results.relayed(whole))
    frames.send_record(sent, None, 5, ("m", "1", "r"), done)
    ((header, _),) = sent.frames
    assert header[:2] == [wire.ERROR, 5] and done.released == 1


@pytest.mark.parametrize(
    "record",
    [
        [[], ["INTERNAL", "boom"], {}],
        [[["x", "FP32", [1], 0, 1, 0, 0, 4]], None, {}],  # a block, not inline
        [[["x", "FP32", [1], 4]], None, {}],
        [[], None],
    ],
)
def test_a_record_that_is_no_inline_success_is_a_value_error(record):
    fields = [frames.head("m", "1"), "r"]
    with pytest.raises(ValueError):
        response_wire.response_from_wire(fields, [memoryview(msgpack.packb(record))])
