"""A large ModelInferRequest received in parts: its large raw entries straight into arena
blocks, cut at every boundary, decoded as the whole message would be; blocks given back."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.core import InvalidArgument
from shoal.frontends.grpc._infer import decode_infer_request
from shoal.frontends.grpc.native_split import RECEIVE_FROM, InferSplitter, SplitRequest
from shoal.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class _Arena:
    """Blocks as bytearrays; what was received, discarded and is still out."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.out: dict[int, bytearray] = {}
        self.sizes: list[int] = []

    def receive(self, nbytes: int) -> tuple[memoryview, object] | None:
        if self.full:
            return None
        block = bytearray(nbytes)
        self.out[id(block)] = block
        self.sizes.append(nbytes)
        return memoryview(block), block

    def discard(self, token: object) -> None:
        del self.out[id(token)]


def _request(*sizes: int) -> tuple[bytes, list[bytes]]:
    """A serialized request with one input of each size (raw contents), and those bytes."""
    request = pb.ModelInferRequest(model_name="identity", id="7")
    request.parameters["sequence_id"].int64_param = 3
    payloads = []
    for index, size in enumerate(sizes):
        request.inputs.add(name=f"IN{index}", datatype="UINT8", shape=[size])
        data = np.random.default_rng(index).integers(0, 256, size, np.uint8).tobytes()
        request.raw_input_contents.append(data)
        payloads.append(data)
    request.outputs.add(name="OUT0")
    return request.SerializeToString(), payloads


def _split(message: bytes, cuts: list[int], arena: _Arena) -> SplitRequest:
    splitter = InferSplitter(arena, len(message))
    view = memoryview(message)
    start = 0
    for cut in [*cuts, len(message)]:
        splitter.feed(view[start:cut])
        start = cut
    return splitter.result()


def _check_decoded(split: SplitRequest, message: bytes, payloads: list[bytes]) -> None:
    decoded = decode_infer_request(split).request
    whole = decode_infer_request(message).request
    assert [bytes(t.data) for t in decoded.inputs] == payloads
    assert [(t.name, t.shape) for t in decoded.inputs] == [(t.name, t.shape) for t in whole.inputs]
    assert decoded.parameters == whole.parameters and decoded.id == "7"
    assert [o.name for o in decoded.outputs] == ["OUT0"]


def test_every_cut_point_of_the_leading_fields_and_entry_heads():
    message, payloads = _request(RECEIVE_FROM, 100, RECEIVE_FROM + 3)
    # Every single cut in the first 200 bytes (tags, lengths, the first entry's start) and
    # around each large entry's end.
    first_end = message.index(payloads[0]) + len(payloads[0])
    points = [*range(1, 200), *range(first_end - 20, first_end + 20)]
    for cut in points:
        arena = _Arena()
        split = _split(message, [cut], arena)
        assert arena.sizes == [RECEIVE_FROM, RECEIVE_FROM + 3], cut  # the small one stays
        _check_decoded(split, message, payloads)
        split.release()
        assert not arena.out


def test_pieces_of_every_small_size():
    message, payloads = _request(RECEIVE_FROM + 1, 5, RECEIVE_FROM * 2)
    for step in (1, 2, 3, 7, 16, 4093, 16384):
        arena = _Arena()
        split = _split(message, list(range(step, len(message), step)), arena)
        assert len(arena.sizes) == 2, step
        _check_decoded(split, message, payloads)
        split.release()
        assert not arena.out


def test_a_full_arena_leaves_entries_in_the_message():
    message, payloads = _request(RECEIVE_FROM * 2, RECEIVE_FROM)
    split = _split(message, [1000, 50000], _Arena(full=True))
    assert bytes(split.rest) == message
    _check_decoded(split, message, payloads)


def test_a_malformed_message_is_rejected_as_the_whole_one_would_be():
    message, _ = _request(RECEIVE_FROM)
    for broken in (
        message[:-1],  # the input's bytes cut short (its field is the last): it overruns
        message + b"\x3a",  # a tag with no length at the end
        message + b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a length that never ends
        b"\x3a\x80\x80\x04" + bytes(40),  # an entry that claims more than the message has
    ):
        arena = _Arena()
        split = _split(broken, [3, len(broken) // 2], arena)
        with pytest.raises(InvalidArgument, match="failed to parse"):
            decode_infer_request(split)
        with pytest.raises(InvalidArgument, match="failed to parse"):
            decode_infer_request(broken)
        split.release()
        assert not arena.out


def test_unusual_fields_are_passed_to_protobuf_whole():
    message, payloads = _request(RECEIVE_FROM, RECEIVE_FROM)
    # A varint field (unknown number 20) before the entries: following stops there, and the
    # entries after it stay in the message; protobuf skips the unknown field.
    at = message.index(b"\x3a")
    unusual = message[:at] + b"\xa0\x01\x05" + message[at:]
    arena = _Arena()
    split = _split(unusual, [at + 1], arena)
    assert not arena.sizes
    _check_decoded(split, unusual, payloads)


def test_a_message_cut_off_gives_its_blocks_back():
    message, _ = _request(RECEIVE_FROM * 3)
    arena = _Arena()
    splitter = InferSplitter(arena, len(message))
    splitter.feed(memoryview(message)[: len(message) // 2])
    assert len(arena.out) == 1
    splitter.release()
    assert not arena.out
