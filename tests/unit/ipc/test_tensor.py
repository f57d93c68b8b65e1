"""Tensor descriptors, NumPy views over buffers and the BYTES codec."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc.arena import Block
from shoal.ipc.dtypes import (
    DATATYPES,
    NUMPY_DTYPES,
    BytesFormatError,
    deserialize_bytes,
    serialize_bytes,
)
from shoal.ipc.tensor import (
    INLINE_MESSAGE_MAX,
    CudaLocation,
    CudaRegionLocation,
    InlineBytes,
    Location,
    RegionLocation,
    TensorDesc,
    buffer_to_numpy,
    location_to_wire,
    numpy_to_buffer_size,
    write_numpy,
)


def objects(items: list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random data covering the whole bit range of a datatype (NaN payloads included)."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        items = [rng.bytes(int(n)) for n in rng.integers(0, 40, count)]
        return objects(items).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_).reshape(shape)
    return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == np.object_:
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (2, 1, 4)])
def test_round_trip_every_datatype(datatype: str, shape: tuple[int, ...]) -> None:
    array = sample(datatype, shape)
    size = numpy_to_buffer_size(array, datatype)
    buf = memoryview(bytearray(size))
    write_numpy(array, datatype, buf)
    back = buffer_to_numpy(datatype, list(shape), buf)
    assert same_bits(back, array)
    if datatype != "BYTES" and size:
        assert not back.flags.writeable
        assert np.shares_memory(back, np.frombuffer(buf, dtype=np.uint8))
        assert buffer_to_numpy(datatype, shape, buf, readonly=False).flags.writeable


def test_size_mismatch_errors_name_everything() -> None:
    with pytest.raises(ValueError, match=r"FP32 tensor of shape \[2, 3\] needs 24 bytes.* 20"):
        buffer_to_numpy("FP32", (2, 3), bytes(20))
    with pytest.raises(ValueError, match=r"INT64 tensor of shape \[2\] needs 16 bytes.* 8"):
        write_numpy(np.zeros(2, np.int64), "INT64", memoryview(bytearray(8)))
    with pytest.raises(BytesFormatError, match="expected 3"):
        buffer_to_numpy("BYTES", (3,), serialize_bytes(np.array([b"a", b"b"], dtype=object)))
    with pytest.raises(ValueError, match="unknown tensor datatype"):
        buffer_to_numpy("FP8", (1,), b"x")


def test_write_converts_within_a_kind_only() -> None:
    buf = memoryview(bytearray(8))
    write_numpy(np.array([1, 2], dtype=np.int64), "INT32", buf)
    assert buffer_to_numpy("INT32", (2,), buf).tolist() == [1, 2]
    with pytest.raises(TypeError):
        write_numpy(np.array([1.5, 2.5]), "INT32", buf)


@pytest.mark.parametrize(
    "location",
    [
        Block(1, 2, 64, 100),
        RegionLocation("client-region", 8, 16),
        CudaLocation(0, 256, 4),
        CudaRegionLocation("3:gpu_in", 1, 64, 16, bytes(range(64))),
        InlineBytes(bytes(range(16))),
        InlineBytes(b""),
    ],
)
def test_descriptor_wire_round_trip(location: Location) -> None:
    desc = TensorDesc("INPUT0", "FP32", (1, 4), location)
    wire = desc.to_wire()
    assert isinstance(wire, list)
    received = msgpack.unpackb(msgpack.packb(wire))
    assert TensorDesc.from_wire(received) == desc
    with pytest.raises(ValueError, match="location"):
        TensorDesc.from_wire([*received[:3], 9, 1, 2, 3])


def test_inline_bytes_travel_as_a_msgpack_bin_in_the_descriptor() -> None:
    desc = TensorDesc("INPUT0", "FP32", (1, 2), InlineBytes(b"\x01" * 8))
    packed = msgpack.packb(desc.to_wire(), use_bin_type=True)
    assert b"\xc4\x08" + b"\x01" * 8 in packed  # bin 8: the bytes themselves, no list of ints
    received = TensorDesc.from_wire(msgpack.unpackb(packed))
    assert type(received.location) is InlineBytes and received.location.nbytes == 8


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ([4, "text"], "must be a bin of at most"),  # a str is not bytes
        ([4, [1, 2]], "got list"),
        ([4, b"x" * (INLINE_MESSAGE_MAX + 1)], f"at most {INLINE_MESSAGE_MAX} bytes"),
        ([4], "malformed tensor location"),  # no bytes at all
        ([4, b"ab", 2], "malformed tensor location"),  # a field too many
    ],
)
def test_a_malformed_inline_tensor_is_refused_by_name(fields: list, words: str) -> None:
    with pytest.raises(ValueError, match="malformed") as caught:
        TensorDesc.from_wire(["INPUT0", "FP32", [2], *fields])
    assert words in str(caught.value)


def test_output_regions_of_both_kinds_cross_the_wire() -> None:
    from shoal.ipc.records import RequestRecord

    regions: dict[str, RegionLocation | CudaRegionLocation] = {
        "A": RegionLocation("1:/cpu", 0, 64),
        "B": CudaRegionLocation("2:gpu", 0, 128, 64, bytes(64)),
    }
    record = RequestRecord("", 0, 0, {}, ["A", "B"], [], output_regions=regions)
    wire = msgpack.unpackb(msgpack.packb(record.to_wire()))
    assert RequestRecord.from_wire(wire).output_regions == regions
    wire[8]["A"] = location_to_wire(Block(1, 2, 3, 4))
    with pytest.raises(ValueError, match="an output region must be a client's region"):
        RequestRecord.from_wire(wire)


bytes_items = st.lists(st.binary(max_size=30), max_size=300)


@settings(max_examples=200, deadline=None)
@given(bytes_items, st.booleans())
def test_bytes_codec_round_trip(items: list[bytes], uniform: bool) -> None:
    if uniform and items:
        items = [items[0]] * len(items)
    array = objects(items)
    raw = serialize_bytes(array)
    assert raw == b"".join(len(x).to_bytes(4, "little") + x for x in items)
    assert deserialize_bytes(raw, count=len(items)).tolist() == items
    assert deserialize_bytes(memoryview(raw)).tolist() == items


@settings(max_examples=200, deadline=None)
@given(bytes_items, st.integers(0, 1 << 12), st.integers(1, 1 << 32 - 1))
def test_bytes_codec_accepts_only_faithful_parses(items: list[bytes], at: int, delta: int) -> None:
    raw = bytearray(serialize_bytes(objects(items)))
    count = max(len(items), 1)
    if items:
        # Corrupt one length prefix. The result may still parse (lengths can trade bytes), but
        # then the parse must re-serialize to exactly the buffer: every prefix was honoured.
        index = at % len(items)
        offset = sum(4 + len(x) for x in items[:index])
        length = (len(items[index]) + delta) % (1 << 32)
        raw[offset : offset + 4] = length.to_bytes(4, "little")
    else:
        raw = bytearray(b"\x01\x00\x00")
    try:
        decoded = deserialize_bytes(bytes(raw), count=count)
    except BytesFormatError:
        return
    assert decoded.tolist() != items
    assert serialize_bytes(decoded) == bytes(raw)


def test_bytes_codec_rejects_lengths_past_the_end() -> None:
    raw = serialize_bytes(objects([b"abc", b"de"]))
    with pytest.raises(BytesFormatError, match="runs past the end"):
        deserialize_bytes((99).to_bytes(4, "little") + raw[4:])
    with pytest.raises(BytesFormatError, match="cut off"):
        deserialize_bytes(raw + b"\x01")
    with pytest.raises(BytesFormatError, match="expected 3"):
        deserialize_bytes(raw, count=3)
    uniform = serialize_bytes(objects([b"xy"] * 100))
    with pytest.raises(BytesFormatError):
        deserialize_bytes(uniform[:-1], count=100)


def test_bytes_of_str_and_fixed_width_arrays() -> None:
    assert deserialize_bytes(serialize_bytes(np.array(["hé", "x"]))).tolist() == [
        "hé".encode(),
        b"x",
    ]
    assert deserialize_bytes(serialize_bytes(np.array([b"ab", b"c"]))).tolist() == [b"ab", b"c"]
    mixed = np.array([b"a", "b", 3], dtype=object)
    assert deserialize_bytes(serialize_bytes(mixed)).tolist() == [b"a", b"b", b"3"]
