"""The frontend's JSON helper: the standard library, or orjson when it is installed."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from shoal.frontends.http import _json

pytestmark = pytest.mark.timeout(30)


class FakeOrjson:
    """Stands in for orjson (not a shoal dependency) to check that it is used when present."""

    JSONDecodeError = json.JSONDecodeError

    def __init__(self) -> None:
        self.calls: list[str] = []

    def loads(self, data: Any) -> Any:
        self.calls.append("loads")
        return json.loads(bytes(data))

    def dumps(self, value: Any) -> bytes:
        self.calls.append("dumps")
        return json.dumps(value).encode()


def test_standard_library_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_json, "_ORJSON", None)
    encoded = _json.dumps({"a": [1, 2.5, "é"], "b": True})
    assert encoded == '{"a":[1,2.5,"é"],"b":true}'.encode()
    assert _json.loads(memoryview(encoded)) == {"a": [1, 2.5, "é"], "b": True}


@pytest.mark.parametrize("use_orjson", [False, True])
def test_invalid_json_raises_one_error_type(
    monkeypatch: pytest.MonkeyPatch, use_orjson: bool
) -> None:
    monkeypatch.setattr(_json, "_ORJSON", FakeOrjson() if use_orjson else None)
    for bad in (b"{", b'"\xff"'):
        with pytest.raises(_json.JsonDecodeError):
            _json.loads(bad)


def test_orjson_is_used_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeOrjson()
    monkeypatch.setattr(_json, "_ORJSON", fake)
    assert _json.loads(_json.dumps([1])) == [1]
    assert fake.calls == ["dumps", "loads"]


def _nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * depth + b"1" + closer * depth


def test_depth_beyond_the_limit_is_refused_whatever_the_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # How deep the standard library's parser goes depends on the Python version and build:
    # stand in one that takes any depth, as some 3.12 builds did for 5,000 levels.
    monkeypatch.setattr(_json, "_std_loads", lambda data: ["parsed by the fallback"])
    monkeypatch.setattr(_json, "_ORJSON", None)
    for depth in (_json.MAX_DEPTH + 1, 1000, 2000):
        with pytest.raises(
            _json.JsonDecodeError, match=r"JSON nesting depth exceeds maximum allowed limit \(100\)"
        ):
            _json.loads(_nested(depth))
    assert _json.loads(_nested(_json.MAX_DEPTH)) == ["parsed by the fallback"]


def test_depth_is_measured_at_the_limit() -> None:
    assert _json.loads(_nested(_json.MAX_DEPTH)) is not None
    deep_object = b'{"a":' * 101 + b"1" + b"}" * 101
    with pytest.raises(_json.JsonDecodeError, match="JSON nesting depth exceeds"):
        _json.loads(deep_object)
    with pytest.raises(_json.JsonDecodeError, match="JSON nesting depth exceeds"):
        _json.loads(memoryview(b"[" + _nested(100) + b"]"))
    # Many brackets, little depth: a large tensor written as nested rows.
    rows = json.dumps({"data": [[1, 2]] * 5000}).encode()
    assert len(_json.loads(rows)["data"]) == 5000


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[" * 500 + '\\"' + "{" * 500  # an escaped backslash, then a quote that ends it
    document = json.dumps({"s": text, "t": '"[[[[' * 50, "d": [[1]]}).encode()
    assert _json.loads(document)["d"] == [[1]]
    with pytest.raises(_json.JsonDecodeError, match="JSON nesting depth exceeds"):
        _json.loads(json.dumps({"s": "[" * 500, "d": [[[1]]]}).encode()[:-2] + _nested(101) + b"}")


# --- NaN and infinities, as Triton writes and reads them ---------------------------------------


def test_non_finite_outputs_are_written_as_triton_writes_them() -> None:
    import numpy as np

    from shoal.frontends.http._tensor_json import json_from_output

    for datatype, dtype in (("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64)):
        data = np.array([1.5, np.inf, -np.inf, np.nan], dtype=dtype).tobytes()
        values = json_from_output("OUT", datatype, (4,), memoryview(data))
        assert _json.dumps({"data": values}) == b'{"data":[1.5,Infinity,-Infinity,NaN]}'
    bf16 = (np.array([2.0, np.inf], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    values = json_from_output("OUT", "BF16", (2,), memoryview(bf16.tobytes()))
    assert _json.dumps(values) == b"[2.0,Infinity]"
    # Python's json (and tritonclient, which uses it) reads them back.
    assert json.loads(_json.dumps(values))[1] == float("inf")


def test_non_finite_values_survive_the_standard_library_fallback() -> None:
    # A lone surrogate makes orjson refuse the document: the fallback writes the same tokens.
    from shoal.frontends.http._tensor_json import json_from_output

    values = json_from_output("OUT", "FP64", (1,), memoryview(bytes.fromhex("000000000000f07f")))
    assert _json.dumps({"id": "\ud800", "data": values}).endswith(b'"data":[Infinity]}')


def test_non_finite_literals_are_read_as_triton_reads_them() -> None:
    document = _json.loads(b'{"data":[NaN,Infinity,-Infinity,1]}')
    assert [str(v) for v in document["data"]] == ["nan", "inf", "-inf", "1"]
    with pytest.raises(_json.JsonDecodeError):
        _json.loads(b'{"data":[nan]}')  # only Triton's spellings


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(item) for item in value.values()), default=0)
    return 0


def _random_value(rng: random.Random, depth: int) -> Any:
    """A random document of exactly ``depth`` levels, with strings full of brackets, quotes and
    backslashes, and wide levels of rows."""
    if depth == 0:
        return rng.choice(
            [1, 2.5, True, None, "".join(rng.choice('[]{}"\\\\ab') for _ in range(6))]
        )
    width = rng.randint(1, 4)
    items = [_random_value(rng, rng.randint(0, min(depth - 1, 2))) for _ in range(width - 1)]
    items.insert(rng.randrange(width), _random_value(rng, depth - 1))
    if rng.random() < 0.5:
        return items
    return {f"k{index}[{{\\": item for index, item in enumerate(items)}


@pytest.mark.parametrize("seed", range(60))
def test_depth_agrees_with_the_parsed_document(seed: int) -> None:
    rng = random.Random(seed)
    depth = rng.choice([_json.MAX_DEPTH - 1, _json.MAX_DEPTH, _json.MAX_DEPTH + 1, 150])
    value = _random_value(rng, depth)
    assert _depth(value) == depth
    body = json.dumps(value).encode()
    if depth > _json.MAX_DEPTH:
        with pytest.raises(_json.JsonDecodeError, match="JSON nesting depth exceeds"):
            _json.check_depth(body)
    else:
        _json.check_depth(body)
