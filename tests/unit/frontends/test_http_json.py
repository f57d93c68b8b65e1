"""The frontend's JSON helper: the standard library, or orjson when it is installed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal.frontends import _json

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
