"""A packed call's frame (``core/packed.py``): what the worker writes is what the core reads,
fields that do not fit send the request the core's way, and the core's reader tells the frame
from MessagePack ones however it arrives."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import pytest

from shoal.core.packed import MARK, PackedCall, encode, frame
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.host import _Link
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.requests.packed import MAX_SLOTS, PackingSlots

pytestmark = pytest.mark.timeout(20)

HEAD = b"\x9b\xa3rid"  # a packed record's head, opaque to the frame


def _fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "slot": 7,
        "generation": 123456789012,
        "request_id": "req-1",
        "batch_size": 4,
        "timeout_us": 250_000,
        "private_inputs": 0b101,
        "blocks": [1 << 32, 4096, 8000, 3, 0, 1 << 20],
    }
    fields.update(changes)
    return fields


def _read(call_id: int, encoded: bytes) -> PackedCall:
    """The call as the core reads it: through a frame reader, with its head as the payload."""
    calls: list[PackedCall] = []

    def on_packed(view: memoryview, start: int, payload: int, stop: int) -> None:
        calls.append(PackedCall(view, start, payload, bytes(view[payload:stop])))

    reader = wire.FrameReader(_no_frame, lambda: None, on_packed)
    reader.data_received(b"".join(frame(call_id, encoded, HEAD)))
    (call,) = calls
    return call


def _no_frame(header: list[Any], payloads: list[memoryview]) -> None:
    raise AssertionError(f"a MessagePack frame: {header}")


@pytest.mark.parametrize("request_id", ["req-1", "", "é-ü 漢"])
def test_the_core_reads_every_field_the_worker_wrote(request_id):
    fields = _fields(request_id=request_id)
    encoded = encode(**fields)
    assert encoded is not None
    call = _read(1 << 40, encoded)
    assert call.call_id == 1 << 40
    assert (call.slot, call.generation, call.request_id) == (7, 123456789012, request_id)
    assert (call.batch_size, call.timeout_us, call.private_inputs) == (4, 250_000, 0b101)
    assert call.numbers == fields["blocks"] and call.head == HEAD
    assert call.blocks == [] and call.request is None and not call.stale


def test_a_call_without_blocks_and_a_negative_timeout():
    encoded = encode(**_fields(blocks=[], timeout_us=-1, private_inputs=0))
    assert encoded is not None
    call = _read(1, encoded)
    assert (call.numbers, call.timeout_us, call.private_inputs) == ([], -1, 0)


@pytest.mark.parametrize(
    "changes",
    [
        {"timeout_us": 1 << 63},
        {"timeout_us": -(1 << 63) - 1},
        {"private_inputs": 1 << 64},
        {"batch_size": 1 << 32},
        {"slot": -1},
        {"blocks": [1 << 64]},
        {"request_id": "\udc80"},  # a lone surrogate: the core's way answers it
    ],
)
def test_a_field_that_does_not_fit_sends_the_request_the_core_s_way(changes):
    assert encode(**_fields(**changes)) is None


def _header(call_id: int = 9) -> bytes:
    encoded = encode(**_fields())
    assert encoded is not None
    _, *header, _ = frame(call_id, encoded, HEAD)
    return b"".join(header)


def test_a_header_that_does_not_add_up_is_refused():
    header = _header()
    assert header[0] == MARK
    with pytest.raises(ValueError):
        PackedCall(header + b"x", 0, len(header) + 1, HEAD)  # longer than its fields say
    with pytest.raises(ValueError):
        PackedCall(b"\xc0" + header[1:], 0, len(header), HEAD)  # not a packed call's mark
    with pytest.raises(struct.error):
        PackedCall(header[:20], 0, 20, HEAD)  # shorter than the fixed fields
    with pytest.raises(UnicodeDecodeError):
        bad = header[:-5] + b"\xff" * 5  # the request id's bytes are not UTF-8
        PackedCall(bad, 0, len(bad), HEAD)


def test_packed_and_messagepack_frames_are_told_apart_however_they_arrive():
    got: list[Any] = []

    def on_packed(view: memoryview, start: int, payload: int, stop: int) -> None:
        call = PackedCall(view, start, payload, bytes(view[payload:stop]))
        got.append(("packed", call.call_id, call.head))

    def on_frame(header: list[Any], payloads: list[memoryview]) -> None:
        got.append(("frame", header, [bytes(p) for p in payloads]))

    encoded = encode(**_fields())
    assert encoded is not None
    stream = b"".join(
        [
            *frame(3, encoded, HEAD),
            *wire.frame([wire.CANCEL, 3], [b"ab"]),
            *frame(4, encoded, b""),
        ]
    )
    whole: list[Any] = []
    for step in (len(stream), 1, 7):  # at once, byte by byte, in pieces across frames
        got.clear()
        reader = wire.FrameReader(on_frame, lambda: None, on_packed)
        for at in range(0, len(stream), step):
            reader.data_received(stream[at : at + step])
        if not whole:
            whole = list(got)
        assert got == whole
    assert whole == [
        ("packed", 3, HEAD),
        ("frame", [wire.CANCEL, 3], [b"ab"]),
        ("packed", 4, b""),
    ]


def test_the_slots_number_each_pair_once_up_to_their_limit():
    slots = PackingSlots(LoadedModels())
    assert slots.number("m", "") == 0 and slots.number("m", "1") == 1
    assert slots.number("m", "") == 0 and slots.pairs == [("m", ""), ("m", "1")]
    for n in range(MAX_SLOTS - 2):
        assert slots.number("x", str(n)) == n + 2
    assert slots.number("m", "2") is None  # full: requests for it take the core's way
    assert slots.number("m", "1") == 1 and len(slots.pairs) == MAX_SLOTS


def test_an_unreadable_packed_call_is_logged_and_left(caplog):
    async def run() -> None:
        link = _Link(None, 2, None)  # type: ignore[arg-type]  # neither is reached
        header = _header(11)[:-1]  # one byte short of its request id
        with caplog.at_level(logging.ERROR, "shoal"):
            link.on_packed(memoryview(header + HEAD), 0, len(header), len(header) + len(HEAD))
        assert not link.calls
        assert "frontend worker 2 sent a packed call the core cannot read" in caplog.text

    asyncio.run(run())
