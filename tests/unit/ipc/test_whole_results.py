"""A Result's whole form (``ipc/whole_results.py``): which Results take it, every field read
back, each record decoded as MessagePack's would be, and a wrong message an error, not a crash."""

from __future__ import annotations

import os

import msgpack
import pytest

from shoal.ipc import messages as msg
from shoal.ipc import whole_results
from shoal.ipc.arena import Block
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import (
    INLINE_TENSOR_MAX,
    CudaLocation,
    InlineBytes,
    RegionLocation,
    TensorDesc,
)

pytestmark = pytest.mark.timeout(10)

SIZES = {
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


def _inline(name: str, datatype: str, shape: tuple[int, ...], nbytes: int) -> TensorDesc:
    return TensorDesc(name, datatype, shape, InlineBytes(os.urandom(nbytes)))


def _every_datatype() -> ResponseRecord:
    outputs = [_inline(f"O_{d}", d, (1, 3), 3 * size) for d, size in SIZES.items()]
    outputs.append(_inline("EMPTY", "FP32", (0, 4), 0))
    outputs.append(_inline("LARGEST", "UINT8", (INLINE_TENSOR_MAX,), INLINE_TENSOR_MAX))
    return ResponseRecord(outputs, None, {"sequence_end": True, "n": 3, "s": "é"})


def _round_trip(result: msg.Result) -> msg.Result:
    decoded = msg.decode(msg.encode(result))
    assert type(decoded) is msg.Result
    return decoded


def test_every_field_and_datatype_reads_back():
    responses = [
        _every_datatype(),
        ResponseRecord([]),
        ResponseRecord([_inline("x", "FP32", (4,), 16)]),
    ]
    result = msg.Result(2**40 + 3, responses, (5, 2**33, 7), stub_ns=(2**62, 2**62 + 9))
    encoded = msg.encode(result)
    assert encoded[0] == whole_results.MARK
    decoded = msg.decode(encoded)
    assert type(decoded) is msg.Result
    assert (decoded.batch_id, decoded.compute_ns, decoded.stub_ns) == (
        2**40 + 3,
        (5, 2**33, 7),
        (2**62, 2**62 + 9),
    )
    assert decoded.responses == [] and decoded.rescheduled == [] and decoded.executed
    assert decoded.wholes is not None
    assert [whole_results.response_of(w) for w in decoded.wholes] == responses


@pytest.mark.parametrize("count", [1, 2, 15, 16, 70, 300])
def test_batches_of_any_size(count):
    responses = [
        ResponseRecord([_inline("y", "INT64", (1,), 8)], None, {"i": i}) for i in range(count)
    ]
    decoded = _round_trip(msg.Result(count, responses, (1, 2, 3)))
    assert decoded.wholes is not None and len(decoded.wholes) == count
    assert [whole_results.response_of(w) for w in decoded.wholes] == responses


def test_relayed_records_carry_their_bytes_undecoded():
    response = _every_datatype()
    decoded = _round_trip(msg.Result(1, [response]))
    assert decoded.wholes is not None
    relayed = whole_results.relayed(decoded.wholes[0])
    assert relayed.whole is decoded.wholes[0]
    assert (relayed.outputs, relayed.error, relayed.parameters) == ([], None, {})
    assert bytes(decoded.wholes[0]) == msg.encode(msg.Result(1, [response]))[-len(relayed.whole) :]


_BLOCK = TensorDesc("b", "FP32", (4,), Block(1, 0, 64, 16))
_OTHERS = {
    "an error": msg.Result(1, [ResponseRecord(error=("INTERNAL", "boom"))]),
    "an error among successes": msg.Result(
        1, [ResponseRecord([_inline("x", "FP32", (1,), 4)]), ResponseRecord(error=("X", "y"))]
    ),
    "a block output": msg.Result(1, [ResponseRecord([_inline("x", "FP32", (1,), 4), _BLOCK])]),
    "a CUDA output": msg.Result(
        1, [ResponseRecord([TensorDesc("g", "FP32", (2,), CudaLocation(0, 0, 8))])]
    ),
    "a client region output": msg.Result(
        1, [ResponseRecord([TensorDesc("r", "FP32", (2,), RegionLocation("reg", 0, 8))])]
    ),
    "a rescheduled request": msg.Result(1, [ResponseRecord([])], rescheduled=[1]),
    "no execution": msg.Result(1, [ResponseRecord(error=("CANCELLED", "c"))], executed=False),
    "no response (decoupled)": msg.Result(1, [], (1, 2, 3)),
}


@pytest.mark.parametrize("name", list(_OTHERS))
def test_other_results_stay_messagepack(name):
    result = _OTHERS[name]
    encoded = msg.encode(result)
    assert encoded[0] != whole_results.MARK
    decoded = msg.decode(encoded)
    assert type(decoded) is msg.Result and decoded.wholes is None
    assert decoded.responses == result.responses
    assert (decoded.rescheduled, decoded.executed) == (result.rescheduled, result.executed)


def test_a_truncated_or_padded_message_is_a_value_error():
    encoded = msg.encode(msg.Result(9, [_every_datatype(), ResponseRecord([])]))
    for end in range(1, len(encoded)):
        with pytest.raises(ValueError):
            msg.decode(encoded[:end])
    with pytest.raises(ValueError):
        msg.decode(encoded + b"\x00")


def test_a_count_past_the_message_is_a_value_error():
    encoded = bytearray(msg.encode(msg.Result(9, [ResponseRecord([])])))
    for count in (0, 2, 2**32 - 1):
        encoded[4:8] = count.to_bytes(4, "little")
        with pytest.raises(ValueError):
            msg.decode(bytes(encoded))


@pytest.mark.parametrize(
    "record", [b"", b"\xc1", b"\x93\x90", b"\x92\x90\xc0", b"\x93\x91\x01\xc0\x80", b"\x01"]
)
def test_a_malformed_record_is_the_requests_internal_error(record):
    response = whole_results.response_of(memoryview(record))
    assert response.outputs == [] and response.error is not None
    assert response.error[0] == "INTERNAL" and "malformed" in response.error[1]


# -- the common record by hand (``_record``, ``read_record``) ---------------------------------

_PACKER = msgpack.Packer(use_bin_type=True)


def _records() -> dict[str, ResponseRecord]:
    """Records of every shape the hand-written path takes or hands to MessagePack."""
    many = [_inline(f"o{i}", "INT8", (1,), 1) for i in range(16)]
    return {
        "one FP32 output": ResponseRecord([_inline("OUTPUT0", "FP32", (1, 16), 64)]),
        "no outputs": ResponseRecord([]),
        "every datatype": ResponseRecord(_every_datatype().outputs),
        "zero elements": ResponseRecord(
            [_inline("E", "FP32", (0,), 0), _inline("S", "FP32", (), 4)]
        ),
        "dims of every int width": ResponseRecord(
            [_inline("d", "UINT8", (127, 128, 255, 256, 65535, 65536, 2**32, 0), 0)]
        ),
        "a negative dim": ResponseRecord([_inline("n", "UINT8", (-1, 3), 0)]),
        "sixteen dims": ResponseRecord([_inline("big", "UINT8", (1,) * 16, 1)]),
        "bytes of every bin width": ResponseRecord(
            [_inline(f"b{n}", "UINT8", (n,), n) for n in (255, 256, 65535, 65536)]
        ),
        "fifteen outputs": ResponseRecord(many[:15]),
        "sixteen outputs": ResponseRecord(many),
        "long and non-ASCII names": ResponseRecord(
            [
                _inline("é" * 20, "BF16", (2,), 4),
                _inline("n" * 31, "FP16", (1,), 2),
                _inline("x" * 32, "FP16", (1,), 2),
                _inline("y" * 300, "FP16", (1,), 2),
            ]
        ),
        "parameters": ResponseRecord([_inline("p", "FP32", (1,), 4)], None, {"a": 1}),
        "a name's second datatype": ResponseRecord([_inline("OUTPUT0", "INT32", (1, 16), 64)]),
    }


def _by_hand(record: bytes) -> list[whole_results.InlineOutput] | None:
    return whole_results._read_success(record, 0, memoryview(record))


@pytest.mark.parametrize("name", list(_records()))
def test_a_record_by_hand_is_messagepacks_bytes(name):
    response = _records()[name]
    assert whole_results._record(_PACKER, response) == _PACKER.pack(response.to_wire())


@pytest.mark.parametrize("name", list(_records()))
def test_a_record_reads_back_by_hand_or_by_messagepack(name):
    response = _records()[name]
    decoded = _round_trip(msg.Result(1, [response]))
    assert decoded.wholes is not None
    outputs, error, parameters = whole_results.read_record(decoded.wholes[0])
    assert error is None and parameters == response.parameters
    expected = [(o.name, o.datatype, o.shape, o.location.data) for o in response.outputs]
    assert [(n, d, s, bytes(data)) for n, d, s, data in outputs] == expected
    assert all(type(data) is memoryview and type(s) is tuple for _, _, s, data in outputs)
    assert whole_results.response_of(decoded.wholes[0]) == response


def test_a_record_read_by_hand_only_where_the_stub_wrote_it_so():
    common = whole_results._record(_PACKER, _records()["one FP32 output"])
    assert _by_hand(common) is not None
    for name in ("parameters", "sixteen outputs", "a negative dim", "sixteen dims"):
        record = whole_results._record(_PACKER, _records()[name])
        assert _by_hand(record) is None, name
    error = _PACKER.pack(ResponseRecord(error=("INTERNAL", "boom")).to_wire())
    assert _by_hand(error) is None
    assert whole_results.read_record(memoryview(error)) == ([], ["INTERNAL", "boom"], {})


def test_a_cut_or_altered_record_is_never_read_by_hand_as_another():
    record = whole_results._record(_PACKER, _records()["every datatype"])
    for end in range(len(record)):
        assert _by_hand(record[:end]) is None
        with pytest.raises((ValueError, msgpack.UnpackException)):
            whole_results.read_record(memoryview(record[:end]))
    assert _by_hand(record + b"\x00") is None


def test_an_output_not_inline_is_a_value_error():
    record = _PACKER.pack(ResponseRecord([_BLOCK]).to_wire())
    with pytest.raises(ValueError, match="output 'b' of a whole record is not inline"):
        whole_results.read_record(memoryview(record))


def test_a_result_of_one_response_has_the_layout_of_any_other():
    response = _records()["one FP32 output"]
    result = msg.Result(2**50 + 1, [response], (1, 2, 3), stub_ns=(4, 5))
    record = _PACKER.pack(response.to_wire())
    head = whole_results._HEAD.pack(whole_results.MARK, 1, 2**50 + 1, 1, 2, 3, 4, 5)
    assert msg.encode(result) == head + len(record).to_bytes(4, "little") + record


@pytest.mark.parametrize(
    "record",
    [
        msgpack.packb(5),  # no triple
        msgpack.packb([1, None, {}]),  # outputs not an array
        msgpack.packb([[1], None, {}]),  # an output not an array
        msgpack.packb([[[]], None, {}]),  # an output of no fields
        msgpack.packb([[["x", "FP32", 5, 4, b"1234"]], None, {}]),  # a shape not an array
        msgpack.packb([[["x", "FP32", [True], 4, b"1234"]], None, {}]),  # a dim not an int
        msgpack.packb([[[1, "FP32", [1], 4, b"1234"]], None, {}]),  # a name not a str
        msgpack.packb([[], None, 5]),  # parameters not a map
        msgpack.packb([{}, None, {}]),  # outputs a map
        msgpack.packb([[], None, {}]) + b"\x00",  # bytes past the record
        b"\x93\x91",  # cut off
        b"\xc1",  # no MessagePack
    ],
)
def test_a_corrupt_record_is_a_value_error_that_says_so(record):
    with pytest.raises(ValueError, match=r"^a whole record is malformed: "):
        whole_results.read_record(memoryview(record))


def test_a_bool_dim_is_written_as_messagepack_writes_it_and_read_as_malformed():
    response = ResponseRecord([_inline("t", "UINT8", (True, False, 1), 0)])
    record = whole_results._record(_PACKER, response)
    assert record == _PACKER.pack(response.to_wire())
    assert msgpack.unpackb(record)[0][0][2] == [True, False, 1]
    assert _by_hand(record) is None
    with pytest.raises(ValueError, match="output 't' has the shape"):
        whole_results.read_record(memoryview(record))
    error = whole_results.response_of(memoryview(record)).error  # the core's reader: the same
    assert error is not None and "malformed tensor shape" in error[1]


# -- a Result of one response read straight from its message (``read_one``) -----------------


@pytest.mark.parametrize("name", list(_records()))
def test_one_response_reads_straight_from_its_message_as_decoded(name):
    response = _records()[name]
    result = msg.Result(2**45 + 7, [response], (3, 2**40, 5), stub_ns=(2**61, 2**61 + 4))
    payload = msg.encode(result)
    one = whole_results.read_one(payload)
    decoded = _round_trip(result)
    assert decoded.wholes is not None
    record = bytes(decoded.wholes[0])
    if _by_hand(record) is None:  # MessagePack's to read, as before
        assert one is None
        return
    assert one is not None
    assert (one.batch_id, one.compute_ns, one.stub_ns) == (
        decoded.batch_id,
        decoded.compute_ns,
        decoded.stub_ns,
    )
    outputs, error, parameters = whole_results.read_record(decoded.wholes[0])
    assert error is None and parameters == {}
    assert [(n, d, s, bytes(b)) for n, d, s, b in one.outputs] == [
        (n, d, s, bytes(b)) for n, d, s, b in outputs
    ]
    assert all(type(b) is memoryview and b.obj is payload for _, _, _, b in one.outputs)


def test_only_a_whole_result_of_one_response_reads_straight():
    one = ResponseRecord([_inline("x", "FP32", (4,), 16)])
    assert whole_results.read_one(msg.encode(msg.Result(1, [one, one]))) is None
    assert whole_results.read_one(msg.encode(msg.Result(1, [ResponseRecord([_BLOCK])]))) is None
    assert whole_results.read_one(msg.encode(msg.Cancel([1]))) is None
    assert whole_results.read_one(b"") is None


def test_a_cut_or_padded_message_of_one_response_is_never_read_straight():
    response = _records()["every datatype"]
    response = ResponseRecord(response.outputs[-15:])  # no parameters, 15 outputs: by hand
    payload = msg.encode(msg.Result(1, [response]))
    assert whole_results.read_one(payload) is not None
    for end in range(len(payload)):
        assert whole_results.read_one(payload[:end]) is None
    assert whole_results.read_one(payload + b"\x00") is None


def test_names_read_once_are_read_again_right():
    names = [("é" * 3, "BF16"), ("OUT", "FP32"), ("OUT", "INT32"), ("n" * 40, "FP16")]
    for _ in range(2):  # the second time from what was remembered
        outputs = [_inline(n, d, (1,), 2) for n, d in names]
        one = whole_results.read_one(msg.encode(msg.Result(1, [ResponseRecord(outputs)])))
        assert one is not None
        assert [(n, d) for n, d, _, _ in one.outputs] == names


def test_a_name_not_utf8_is_left_to_messagepack():
    record = bytearray(whole_results._record(_PACKER, _records()["one FP32 output"]))
    at = record.index(b"OUTPUT0")
    record[at] = 0xFF
    assert _by_hand(bytes(record)) is None
