"""A call's request messages cut out of its DATA: fed by runs of frames (``feed_pieces``, as the
HTTP/2 reader hands them on), however the runs and frames fall, the messages are those fed one
frame at a time, byte for byte, and the bytes counted against the connection's budget are the
same; a budget that says no stops the reading."""

from __future__ import annotations

import random

import pytest

from shoal.frontends.grpc.native_messages import BufferPool, Message, MessageReader
from shoal.frontends.grpc.native_split import InferSplitter, SplitRequest

pytestmark = pytest.mark.timeout(60)


class _Arena:
    """Blocks for large entries: plain buffers (what matters here is what lands in them)."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytearray] = {}

    def receive(self, nbytes: int) -> tuple[memoryview, object]:
        block = bytearray(nbytes)
        self.blocks[id(block)] = block
        return memoryview(block), id(block)

    def discard(self, token: object) -> None:
        assert isinstance(token, int)
        self.blocks.pop(token)


def _framed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _raw_entry(payload: bytes) -> bytes:
    """A ModelInferRequest's raw_input_contents entry (field 7, length-delimited)."""
    size = len(payload)
    varint = bytearray()
    while size >= 0x80:
        varint.append((size & 0x7F) | 0x80)
        size >>= 7
    varint.append(size)
    return b"\x3a" + bytes(varint) + payload


def _messages() -> list[bytes]:
    rng = random.Random(7)
    big = bytes(rng.getrandbits(8) for _ in range(300_000))
    return [
        b"small",
        b"\x0a\x02id" + _raw_entry(big[:100_000]) + _raw_entry(big[100_000:]),  # split
        b"",
        bytes(70_000),  # not a ModelInfer: split, then passed whole to the buffer
        b"tail" * 10,
        big[:280_000],  # unsplit: received into the pooled buffer of the second one
    ]


class _Reading:
    def __init__(self, split: bool, budget: int = 1 << 40) -> None:
        self.got: list[bytes] = []
        self.held = 0
        self.budget = budget
        self.refused = False
        self.arena = _Arena()
        splitting = (lambda size: InferSplitter(self.arena, size)) if split else None
        self.reader = MessageReader(
            BufferPool(), 1 << 24, True, self._message, self._too_large, self._hold, splitting
        )

    def _message(self, message: Message, compressed: bool) -> None:
        if isinstance(message, SplitRequest):
            fields = _join_split(message)
            message.release()
            self.got.append(fields)
        else:
            self.got.append(bytes(message))
        self.reader.release()

    def _too_large(self, size: int) -> None:
        raise AssertionError(size)

    def _hold(self, size: int) -> bool:
        if self.held + size > self.budget:
            self.refused = True
            self.reader.closed = True  # as the call does when it fails
            return False
        self.held += size
        return True


def _join_split(request: SplitRequest) -> bytes:
    """The wire bytes of a split request, its entries received apart put back in place (the
    entries here are the message's last fields, so those in ``rest`` come before them)."""
    apart = [bytes(entry) for entry in request.entries([])]
    return bytes(request.rest) + b"".join(_raw_entry(entry) for entry in apart)


def _frames(stream: bytes, rng: random.Random) -> list[memoryview]:
    sizes = [1, 5, 6, 100, 9_000, 16_384, 16_384, 16_384]
    out, at = [], 0
    while at < len(stream):
        size = rng.choice(sizes)
        out.append(memoryview(stream[at : at + size]))
        at += size
    return out


def _runs(frames: list[memoryview], rng: random.Random) -> list[list[memoryview]]:
    runs, at = [], 0
    while at < len(frames):
        size = rng.choice([1, 2, 3, 4, 16])
        runs.append(frames[at : at + size])
        at += size
    return runs


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_runs_of_frames_give_the_messages_of_single_frames(split: bool, seed: int) -> None:
    messages = _messages()
    stream = b"".join(_framed(message) for message in messages)
    rng = random.Random(seed)
    frames = _frames(stream, rng)
    single = _Reading(split)
    for frame in frames:
        single.reader.feed(frame)
    by_runs = _Reading(split)
    for run in _runs(frames, rng):
        by_runs.reader.feed_pieces(run)
    assert single.got == messages
    assert by_runs.got == messages
    assert by_runs.held == single.held
    assert not by_runs.reader.mid_message()
    assert not by_runs.arena.blocks  # every block received into was released


def test_a_budget_that_says_no_stops_the_reading_inside_a_run() -> None:
    """As the call does when its connection's budget is spent: it fails, nothing more is read
    (no more bytes held, no message)."""
    frames = _frames(_framed(bytes(300_000)), random.Random(1))
    reading = _Reading(split=False, budget=100_000)
    for run in _runs(frames, random.Random(2)):
        reading.reader.feed_pieces(run)
    assert reading.refused and reading.reader.closed
    assert reading.got == []
    assert 0 < reading.held <= 100_000


def _place_or_feed(reader: MessageReader, piece: memoryview) -> int:
    """What the connection does with a DATA payload when it may read into place: the bytes the
    reader has a place for are written there (then ``placed``), the rest fed; the bytes placed."""
    placed = 0
    while piece and not reader.closed:
        place = reader.receive_buffer(len(piece))
        if place is None:
            reader.feed(piece)
            break
        assert 0 < len(place) <= len(piece)
        place[:] = piece[: len(place)]
        reader.placed(len(place))
        placed += len(place)
        piece = piece[len(place) :]
    return placed


@pytest.mark.parametrize("seed", range(4))
def test_bytes_read_into_place_give_the_same_messages(seed: int) -> None:
    """Large entries' bytes read straight into their blocks, however the payloads cut them:
    the same messages, the same bytes held, every block given back."""
    messages = _messages()
    stream = b"".join(_framed(message) for message in messages)
    rng = random.Random(seed)
    reading = _Reading(split=True)
    placed = sum(_place_or_feed(reading.reader, frame) for frame in _frames(stream, rng))
    assert reading.got == messages
    single = _Reading(split=True)
    for frame in _frames(stream, random.Random(seed)):
        single.reader.feed(frame)
    assert reading.held == single.held
    assert placed > 250_000  # most of the two large entries
    assert not reading.reader.mid_message()
    assert not reading.arena.blocks


def test_no_place_without_a_split_message_or_once_closed() -> None:
    reading = _Reading(split=False)
    reading.reader.feed(memoryview(_framed(_raw_entry(bytes(200_000)))[:1000]))
    assert reading.reader.receive_buffer(100_000) is None  # received into a buffer, not split
    reading = _Reading(split=True)
    reading.reader.feed(memoryview(_framed(_raw_entry(bytes(200_000)))[:1000]))
    place = reading.reader.receive_buffer(1 << 20)
    assert place is not None and len(place) == 200_000 - (1000 - 5 - 4)  # the entry's rest
    reading.reader.closed = True
    assert reading.reader.receive_buffer(100_000) is None


def test_a_budget_that_says_no_to_placed_bytes_stops_the_reading() -> None:
    reading = _Reading(split=True, budget=150_000)
    frames = _frames(_framed(_raw_entry(bytes(300_000))), random.Random(3))
    for frame in frames:
        _place_or_feed(reading.reader, frame)
    assert reading.refused and reading.reader.closed
    assert reading.got == []
    assert 0 < reading.held <= 150_000
    reading.reader.release()
    assert not reading.arena.blocks


@pytest.mark.parametrize("split", [False, True])
def test_messages_whole_in_their_payloads_are_those_of_any_frames(split: bool) -> None:
    """A payload that is one message, prefix and all (a small call's DATA, read at once), gives
    what the same stream cut into any frames gives: the messages and the bytes held."""
    messages = [*_messages(), bytes(65_535), bytes(65_536)]
    whole = _Reading(split)
    for message in messages:
        whole.reader.feed(memoryview(_framed(message)))
    framed = _Reading(split)
    for frame in _frames(b"".join(_framed(message) for message in messages), random.Random(3)):
        framed.reader.feed(frame)
    assert whole.got == framed.got == messages
    assert whole.held == framed.held
    assert not whole.reader.mid_message()


def test_a_whole_message_keeps_its_compressed_flag_and_its_budget() -> None:
    got: list[tuple[bytes, bool]] = []
    refused: list[int] = []
    reader = MessageReader(
        BufferPool(),
        1 << 20,
        True,
        lambda message, compressed: got.append((bytes(message), compressed)),
        refused.append,
        lambda size: size < 10,
    )
    reader.feed(memoryview(b"\x01" + (3).to_bytes(4, "big") + b"abc"))
    reader.feed(memoryview(_framed(b"")))
    assert got == [(b"abc", True), (b"", False)]
    reader.feed(memoryview(_framed(b"0123456789")))  # more than the budget allows: not read
    assert got == [(b"abc", True), (b"", False)]
    assert not refused
