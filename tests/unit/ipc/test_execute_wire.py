"""The Execute message's bytes: packed directly, exactly as its generic form packs them.

``messages.encode`` packs an Execute without its ``fields()`` list, an arena block's descriptor
as one list and a shape as its tuple; the stub decodes what it always decoded, so the bytes must
be those of ``[kind, *fields()]`` with every shape a list, for every kind of tensor location.
"""

from __future__ import annotations

from typing import Any

import msgpack

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import (
    CudaLocation,
    CudaRegionLocation,
    InlineBytes,
    RegionLocation,
    TensorDesc,
    location_to_wire,
)


def _generic(message: msg.Execute) -> bytes:
    """The Execute as it was packed before: every list written out, shapes as lists."""

    def tensor(desc: TensorDesc) -> list[Any]:
        return [desc.name, desc.datatype, list(desc.shape), *location_to_wire(desc.location)]

    def record(r: RequestRecord) -> list[Any]:
        return [
            r.request_id,
            r.correlation_id,
            r.flags,
            r.parameters,
            r.requested_outputs,
            [tensor(t) for t in r.inputs],
            r.timeout_us,
            r.key,
            {name: location_to_wire(region) for name, region in r.output_regions.items()},
            r.private_inputs,
            r.trace_context,
        ]

    kind = int(msg.Kind.EXECUTE)
    return bytes(msgpack.packb([kind, message.batch_id, [record(r) for r in message.requests]]))


def _records() -> list[RequestRecord]:
    plain = RequestRecord(
        "", 0, 0, {}, ["OUTPUT0"], [TensorDesc("INPUT0", "FP32", (16,), Block(1, 0, 64, 64))]
    )
    everything = RequestRecord(
        "id-7",
        "sequence-a",
        3,
        {"sequence_id": "sequence-a", "timeout": 5, "custom": 1.5, "flag": True},
        ["A", "B"],
        [
            TensorDesc("X", "INT64", (2, 3), Block(1 << 32, 2, 128, 48)),
            TensorDesc("Y", "FP32", (4,), RegionLocation("1:/region", 16, 16)),
            TensorDesc("Z", "FP16", (), CudaLocation(0, 256, 2)),
            TensorDesc("W", "BYTES", (1, 1), CudaRegionLocation("2:gpu", 1, 0, 8, bytes(64))),
            TensorDesc("V", "INT8", (1, 3), InlineBytes(b"\x01\x02\x03")),
        ],
        timeout_us=5,
        key=42,
        output_regions={
            "A": RegionLocation("1:/out", 0, 64),
            "B": CudaRegionLocation("3:gpu", 0, 128, 64, bytes(range(64))),
        },
        private_inputs=1,
        trace_context='{"traceparent": "00-ab-cd-01"}',
    )
    return [plain, everything]


def test_execute_bytes_are_those_of_its_generic_form() -> None:
    for requests in ([], _records()[:1], _records()):
        message = msg.Execute(9, requests)
        assert msg.encode(message) == _generic(message)


def test_execute_round_trips() -> None:
    message = msg.Execute(3, _records())
    decoded = msg.decode(msg.encode(message))
    assert isinstance(decoded, msg.Execute)
    assert decoded.batch_id == 3
    assert decoded.requests == message.requests


def test_a_result_with_inline_outputs_round_trips() -> None:
    outputs = [
        TensorDesc("OUT", "FP32", (1, 2), InlineBytes(bytes(8))),
        TensorDesc("BIG", "FP32", (1, 4096), Block(7, 0, 0, 16384)),
    ]
    message = msg.Result(5, [msg.ResponseRecord(outputs, None, {"p": 1})])
    decoded = msg.decode(msg.encode(message))
    assert isinstance(decoded, msg.Result)
    assert decoded.responses[0].outputs == outputs
