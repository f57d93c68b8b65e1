"""Large JSON documents parsed in pieces: no parser call over much more than a piece, and the
same document (or the same error) as one parse of the whole."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import orjson
import pytest

from shoal.core.errors import InvalidArgument
from shoal.frontends.http import _json, _json_pieces, _tensor_json
from shoal.frontends.http.codec import decode_infer_request

pytestmark = pytest.mark.timeout(60)

PIECE = 512


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes of a real run divided by 512: the same code paths on documents of kilobytes."""
    monkeypatch.setattr(_json, "LARGE", 2048)
    monkeypatch.setattr(_json_pieces, "PIECE", PIECE)
    monkeypatch.setattr(_json_pieces, "MIN_ARRAY", 128)


class Recording:
    """orjson, recording the size of every document it is given."""

    JSONDecodeError = orjson.JSONDecodeError

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def loads(self, data: Any) -> Any:
        self.sizes.append(len(data))
        return orjson.loads(data)

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)


def _infer_body(values: Any, shape: list[int], datatype: str = "FP32") -> bytes:
    inputs = [{"name": "X", "datatype": datatype, "shape": shape, "data": values}]
    return orjson.dumps({"id": "r", "inputs": inputs, "outputs": [{"name": "Y"}]})


def test_no_parser_call_takes_much_more_than_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = Recording()
    monkeypatch.setattr(_json, "_ORJSON", recording)
    body = _infer_body([1.5] * 5000, [5000])
    assert len(body) > 10 * PIECE
    decoded = decode_infer_request(body, model_name="m")
    assert decoded.request.inputs[0].data.tolist() == [1.5] * 5000
    assert max(recording.sizes) < PIECE + 64, recording.sizes  # a piece cut at its next comma
    assert sum(recording.sizes) >= len(body) - 64  # every byte parsed once


def _random_document(rng: random.Random) -> Any:
    def number() -> Any:
        kind = rng.randrange(5)
        if kind == 0:
            return rng.randint(-(2**63), 2**63 - 1)
        if kind == 1:
            return rng.uniform(-1e30, 1e30)
        if kind == 2:
            return rng.random()
        if kind == 3:
            return rng.choice([True, False])
        return rng.randint(-5, 5)

    rows, columns = rng.randint(1, 400), rng.randint(1, 5)
    nested = rng.random() < 0.5
    values: Any = [[number() for _ in range(columns)] for _ in range(rows)]
    if not nested:
        values = [value for row in values for value in row]
    inputs = [
        {"name": "A", "datatype": "FP64", "shape": [rows, columns], "data": values},
        {"name": "B", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "C", "datatype": "BYTES", "shape": [1], "data": ['x"data":[1,2,3]']},
    ]
    rng.shuffle(inputs)
    return {"inputs": inputs, "parameters": {"data": [3] * rng.randint(0, 300)}}


@pytest.mark.parametrize("seed", range(40))
def test_the_same_document_as_one_parse(seed: int) -> None:
    document = _random_document(random.Random(seed))
    body = orjson.dumps(document)
    if seed % 3 == 0:
        body = body.replace(b",", b", ").replace(b":", b": ")  # spaces between values
    assert _json.loads(body) == orjson.loads(body)


def test_infinities_and_nan_as_triton_writes_them() -> None:
    body = b'{"inputs": [{"name": "X", "data": [' + b"1.5," * 400 + b"NaN,Infinity,-Infinity]}]}"
    document = _json.loads(body)
    assert _json_pieces.parse_in_pieces(body, _json._std_loads) is not None
    values = document["inputs"][0]["data"]
    assert values[:400] == [1.5] * 400 and math.isnan(values[400])
    assert values[401:] == [math.inf, -math.inf]


@pytest.mark.parametrize(
    "broken",
    [
        b"1.5,,2",  # an empty element
        b"1.5,2,",  # a trailing comma
        b"1.5,[2",  # an array left open
        b"1.5,2]]",  # closed twice
        b"1.5,tru",  # a bad literal
        b"1.5,2e",  # a bad number
    ],
)
def test_an_invalid_document_gets_the_whole_parse_s_error(broken: bytes) -> None:
    body = b'{"inputs":[{"name":"X","data":[' + b"1.5," * 500 + broken + b"]}]}"
    with pytest.raises(_json.JsonDecodeError) as pieces:
        _json.loads(body)
    with pytest.raises(orjson.JSONDecodeError) as whole:
        orjson.loads(body)
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)
    assert str(pieces.value) == str(whole.value)


@pytest.mark.parametrize(
    "body",
    [
        # a duplicate key: the last one counts
        b'{"inputs":[{"data":[' + b"1," * 300 + b'1],"data":[2]}]}',
        # nested rows written with spaces between them
        b'{"inputs":[{"data":[' + b"[1, 2], " * 100 + b"[1, 2]]}]}",
        # uneven rows
        b'{"inputs":[{"data":[[[1]],' + b"[2]," * 100 + b"[3]]}]}",
        # "data" inside a string, then a key
        b'{"s":"\\"data\\":[' + b"1," * 100 + b'1]","inputs":[{"data":[' + b"4," * 100 + b"4]}]}",
    ],
)
def test_other_shapes_parse_the_same(body: bytes) -> None:
    assert _json.loads(body) == orjson.loads(body)


def test_a_large_list_is_freed_in_slices_once_converted() -> None:
    values = [1.0] * 200_000
    array = _tensor_json.array_from_json("X", "FP32", (200_000,), values)
    assert array.dtype == np.float32 and array.shape == (200_000,) and values == []
    bad: list[Any] = [1.0] * 100_000 + ["x"]
    with pytest.raises(InvalidArgument, match="'X'"):
        _tensor_json.array_from_json("X", "FP32", (100_001,), bad)
    assert bad == []


def test_the_collector_is_off_while_a_large_body_is_decoded_and_back_after() -> None:
    import gc

    assert gc.isenabled()

    def inner() -> bool:
        return gc.isenabled()

    def outer() -> tuple[bool, bool]:
        nested = _json.in_background(inner)  # another decode at the same time
        return nested, gc.isenabled()

    assert _json.in_background(outer) == (False, False)
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        _json.in_background(lambda: 1 / 0)
    assert gc.isenabled()
    gc.disable()  # an application that runs without it: left off
    try:
        _json.in_background(inner)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_switch_interval_is_short_while_large_json_work_runs_and_back_after() -> None:
    """Large JSON work in a thread lets the event loop take the GIL back within
    SWITCH_INTERVAL, not Python's 5 ms (a small request's few dozen waits add up)."""
    import sys

    before = sys.getswitchinterval()

    def inner() -> float:
        return sys.getswitchinterval()

    def outer() -> tuple[float, float]:
        return _json.in_background(inner), sys.getswitchinterval()

    short = pytest.approx(_json.SWITCH_INTERVAL)
    assert _json.in_background(outer) == (short, short)
    assert before > _json.SWITCH_INTERVAL
    assert sys.getswitchinterval() == before
    with pytest.raises(ZeroDivisionError):
        _json.in_background(lambda: 1 / 0)
    assert sys.getswitchinterval() == before


def test_large_json_work_lets_the_gil_go_between_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each slice of a large output's encoding and each piece of a large body's parse starts by
    letting the GIL go (os.sched_yield), so a waiting event loop runs between the steps."""
    import os

    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    values = np.arange(5 * _tensor_json._SLICE, dtype=np.float32)
    pieces = _tensor_json.json_pieces_from_output(
        "OUT", "FP32", (values.size,), memoryview(values.tobytes())
    )
    assert pieces is not None and len(yields) == 5
    body = _infer_body(list(range(3000)) * 200, [600000], "INT32")
    yields.clear()
    _json.loads(body, numbers=True)
    assert len(yields) == len(list(_json_pieces._pieces(body, _json_pieces._arrays(body)[0])))
    assert len(yields) > 1


def test_arrays_of_numbers_come_back_as_numpy_pieces() -> None:
    body = _infer_body([[1, 2]] * 3000, [3000, 2], "INT32")
    data = _json.loads(body, numbers=True)["inputs"][0]["data"]
    assert isinstance(data, _json_pieces.NumberArray) and data.pieces is not None
    assert len(data.pieces) > 10 and all(piece.shape[1:] == (2,) for piece in data.pieces)
    assert data.tolist() == [[1, 2]] * 3000
    assert _json.loads(body) == orjson.loads(body)  # lists where not asked for


def _values(rng: random.Random, kinds: str, count: int) -> list[Any]:
    makers = {
        "i": lambda: rng.randint(-300, 300),
        "I": lambda: rng.choice([2**63, 2**64 - 1, -(2**63), 2**64, -(2**63) - 1]),
        "f": lambda: rng.uniform(-1e6, 1e6),
        "F": lambda: rng.choice([1e300, -1e39, 16777217.0, 0.1]),
        "b": lambda: rng.choice([True, False]),
        "n": lambda: None,
    }
    return [makers[rng.choice(kinds)]() for _ in range(count)]


def _decoded(body: bytes) -> Any:
    try:
        array = decode_infer_request(body, model_name="m").request.inputs[0].data
    except InvalidArgument as exc:
        return str(exc)
    return array.dtype, array.shape, array.tobytes()


@pytest.mark.parametrize("seed", range(60))
def test_numpy_pieces_convert_as_the_whole_list(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    datatype = rng.choice(["BOOL", "INT8", "UINT16", "INT32", "INT64", "UINT64", "FP16", "FP32"])
    # Mostly one kind, now and then another value in one place: where it lands decides which
    # piece holds it, and the array must not depend on that.
    main = {"BOOL": "b", "FP16": "f", "FP32": "f"}.get(datatype, "i")
    count = rng.randint(300, 3000)
    values = _values(rng, main, count)
    for _ in range(rng.randint(0, 2)):
        values[rng.randrange(count)] = _values(rng, rng.choice("iIfFbn"), 1)[0]
    shape = [count]
    if rng.random() < 0.4 and count % 2 == 0:
        values = [values[at : at + 2] for at in range(0, count, 2)]
        shape = [count // 2, 2]
        if rng.random() < 0.2:
            values[rng.randrange(len(values))] = [values[0][0]]  # one uneven row
    if rng.random() < 0.2:
        shape = [count + 1]  # a shape the data does not fill
    inputs = [{"name": "X", "datatype": datatype, "shape": shape, "data": values}]
    body = json.dumps({"inputs": inputs}, separators=(",", ":")).encode()  # integers past 64 bits
    in_pieces = _decoded(body)
    monkeypatch.setattr(_json, "LARGE", len(body) + 1)  # one parse of the whole, as before
    assert in_pieces == _decoded(body)


def test_integer_pieces_among_floats_round_as_the_whole_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The whole list is float64 first: 2**60 + 2**36 + 1 rounds to 2**60 + 2**36 there, then to
    # 2**60 as FP32; straight from int64 to FP32 it would round up to 2**60 + 2**37.
    values: list[Any] = [2**60 + 2**36 + 1] * 500 + [0.5] * 500
    body = _infer_body(values, [1000])
    in_pieces = _decoded(body)
    assert in_pieces[2][:4] == np.float32(2.0**60).tobytes()
    monkeypatch.setattr(_json, "LARGE", len(body) + 1)
    assert in_pieces == _decoded(body)
