"""encode_infer_response: JSON and binary outputs, headers, chunks, and malformed outputs."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from shoal.core import InferOutput, InferResponse, InternalError, InvalidArgument
from shoal.frontends.http.codec import EncodedResponse, OutputFormat, encode_infer_response
from shoal.ipc.dtypes import serialize_bytes

pytestmark = pytest.mark.timeout(30)

BINARY = OutputFormat(binary_default=True)
JSON = OutputFormat()


def output(name: str, array: np.ndarray, datatype: str, **parameters: Any) -> InferOutput:
    raw = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
    return InferOutput(name, datatype, array.shape, memoryview(raw), parameters)


def response(*outputs: InferOutput, **fields: Any) -> InferResponse:
    return InferResponse("m", "1", outputs=list(outputs), **fields)


def split(encoded: EncodedResponse) -> tuple[dict[str, Any], bytes]:
    headers = dict(encoded.headers)
    body = encoded.body()
    size = int(headers.get("inference-header-content-length", len(body)))
    return json.loads(body[:size]), body[size:]


JSON_CASES = [
    ("BOOL", np.array([True, False]), [True, False]),
    ("UINT8", np.array([0, 255], np.uint8), [0, 255]),
    ("UINT16", np.array([1, 65535], np.uint16), [1, 65535]),
    ("UINT32", np.array([1, 2**32 - 1], np.uint32), [1, 2**32 - 1]),
    ("UINT64", np.array([1, 2**64 - 1], np.uint64), [1, 2**64 - 1]),
    ("INT8", np.array([-128, 127], np.int8), [-128, 127]),
    ("INT16", np.array([-2, 2], np.int16), [-2, 2]),
    ("INT32", np.array([-(2**31), 7], np.int32), [-(2**31), 7]),
    ("INT64", np.array([-(2**63), 2**63 - 1], np.int64), [-(2**63), 2**63 - 1]),
    ("FP16", np.array([1.5, -0.25], np.float16), [1.5, -0.25]),
    ("FP32", np.array([0.5, 3.0], np.float32), [0.5, 3.0]),
    ("FP64", np.array([1e300, -1.0]), [1e300, -1.0]),
    ("BYTES", np.array([b"ab", "é".encode()], dtype=object), ["ab", "é"]),
]


class TestJsonOutputs:
    @pytest.mark.parametrize(("datatype", "array", "expected"), JSON_CASES)
    def test_each_datatype(self, datatype: str, array: np.ndarray, expected: list[Any]) -> None:
        encoded = encode_infer_response(response(output("Y", array, datatype)), JSON)
        assert encoded.headers == (("content-type", "application/json"),)
        document, rest = split(encoded)
        assert rest == b""
        assert document["outputs"] == [
            {"name": "Y", "datatype": datatype, "shape": [2], "data": expected}
        ]

    def test_data_is_flat_in_row_major_order(self) -> None:
        array = np.arange(6, dtype=np.int32).reshape(2, 3)
        document, _ = split(encode_infer_response(response(output("Y", array, "INT32")), JSON))
        assert document["outputs"][0]["shape"] == [2, 3]
        assert document["outputs"][0]["data"] == [0, 1, 2, 3, 4, 5]

    def test_bool_treats_any_non_zero_byte_as_true(self) -> None:
        out = InferOutput("Y", "BOOL", (3,), memoryview(b"\x00\x02\x01"))
        document, _ = split(encode_infer_response(response(out), JSON))
        assert document["outputs"][0]["data"] == [False, True, True]

    def test_bf16_becomes_exact_numbers(self) -> None:
        words = (np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16).astype("<u2")
        out = InferOutput("Y", "BF16", (2,), memoryview(words.tobytes()))
        document, _ = split(encode_infer_response(response(out), JSON))
        assert document["outputs"][0]["data"] == [1.5, -2.0]

    def test_response_fields(self) -> None:
        out = output("Y", np.array([1], np.int8), "INT8", note="x")
        encoded = encode_infer_response(response(out, id="r7", parameters={"p": 1}), JSON)
        document, _ = split(encoded)
        assert document == {
            "id": "r7",
            "model_name": "m",
            "model_version": "1",
            "parameters": {"p": 1},
            "outputs": [
                {
                    "name": "Y",
                    "datatype": "INT8",
                    "shape": [1],
                    "parameters": {"note": "x"},
                    "data": [1],
                }
            ],
        }

    def test_empty_id_and_parameters_are_left_out(self) -> None:
        document, _ = split(encode_infer_response(response(), JSON))
        assert document == {"model_name": "m", "model_version": "1", "outputs": []}


class TestBinaryOutputs:
    def test_header_then_data_in_output_order(self) -> None:
        first = np.arange(3, dtype=np.float32)
        second = np.array([b"x", b"yz"], dtype=object)
        encoded = encode_infer_response(
            response(output("A", first, "FP32"), output("B", second, "BYTES")), BINARY
        )
        headers = dict(encoded.headers)
        assert headers["content-type"] == "application/octet-stream"
        document, rest = split(encoded)
        sizes = [entry["parameters"]["binary_data_size"] for entry in document["outputs"]]
        assert sizes == [12, 11]
        assert all("data" not in entry for entry in document["outputs"])
        assert rest == first.tobytes() + serialize_bytes(second)

    def test_chunks_view_the_outputs_until_joined(self) -> None:
        raw = bytearray(np.arange(4, dtype=np.int32).tobytes())
        out = InferOutput("A", "INT32", (4,), memoryview(raw))
        encoded = encode_infer_response(response(out), BINARY)
        header, data = encoded.chunks
        assert isinstance(data, memoryview) and data.obj is raw
        assert int(dict(encoded.headers)["inference-header-content-length"]) == len(header)

    def test_per_output_choice_wins_over_the_default(self) -> None:
        fmt = OutputFormat(binary_default=True, binary={"J": False})
        outputs = (
            output("J", np.array([1], np.int8), "INT8"),
            output("B", np.array([2], np.int8), "INT8"),
        )
        document, rest = split(encode_infer_response(response(*outputs), fmt))
        assert document["outputs"][0]["data"] == [1]
        assert document["outputs"][1]["parameters"] == {"binary_data_size": 1}
        assert rest == b"\x02"

    def test_binary_size_joins_output_parameters(self) -> None:
        out = output("A", np.array([1], np.uint8), "UINT8", note="kept")
        document, _ = split(encode_infer_response(response(out), BINARY))
        assert document["outputs"][0]["parameters"] == {"note": "kept", "binary_data_size": 1}

    def test_empty_binary_output(self) -> None:
        out = output("A", np.zeros((0,), np.float32), "FP32")
        encoded = encode_infer_response(response(out), BINARY)
        assert len(encoded.chunks) == 1
        document, rest = split(encoded)
        assert document["outputs"][0]["parameters"] == {"binary_data_size": 0} and rest == b""

    def test_multi_byte_format_views_are_sent_as_bytes(self) -> None:
        array = np.array([1.0, 2.0], np.float64)
        out = InferOutput("A", "FP64", (2,), memoryview(array))  # format "d", not "B"
        _, rest = split(encode_infer_response(response(out), BINARY))
        assert rest == array.tobytes()

    def test_shared_memory_outputs_carry_no_data(self) -> None:
        fmt = OutputFormat(binary_default=True, shared_memory=frozenset({"S"}))
        placed = {
            "shared_memory_region": "r",
            "shared_memory_offset": 0,
            "shared_memory_byte_size": 16,
        }
        out = InferOutput("S", "FP32", (4,), memoryview(b""), placed)
        encoded = encode_infer_response(response(out), fmt)
        document, rest = split(encoded)
        # As Triton: no parameters, which perf_analyzer's C++ client would read as binary data.
        assert document["outputs"] == [{"name": "S", "datatype": "FP32", "shape": [4]}]
        assert dict(encoded.headers)["content-type"] == "application/json" and rest == b""


class TestOutputErrors:
    @pytest.mark.parametrize("fmt", [BINARY, JSON])
    def test_size_not_matching_the_shape(self, fmt: OutputFormat) -> None:
        out = InferOutput("A", "FP32", (4,), memoryview(b"\x00" * 12))
        with pytest.raises(InternalError) as info:
            encode_infer_response(response(out), fmt)
        assert info.value.message.startswith(
            "output tensor shape does not match size of output for 'A'"
        )

    def test_malformed_serialized_bytes(self) -> None:
        out = InferOutput("S", "BYTES", (1,), memoryview(b"\x09\x00\x00\x00ab"))
        with pytest.raises(InternalError) as info:
            encode_infer_response(response(out), JSON)
        assert "output tensor shape does not match size of output for 'S'" in info.value.message

    def test_non_utf8_bytes_cannot_be_json(self) -> None:
        out = output("S", np.array([b"ok", b"\xff\xfe"], dtype=object), "BYTES")
        with pytest.raises(InvalidArgument) as info:
            encode_infer_response(response(out), JSON)
        assert info.value.message == (
            "output 'S' element 1 is not valid UTF-8 and cannot be sent as JSON; "
            "request the output with binary_data=true"
        )

    def test_non_utf8_bytes_are_fine_in_binary(self) -> None:
        array = np.array([b"\xff\xfe"], dtype=object)
        _, rest = split(encode_infer_response(response(output("S", array, "BYTES")), BINARY))
        assert rest == serialize_bytes(array)


class TestLargeJsonOutputs:
    """An output of more values than a slice is encoded a slice at a time: the same bytes."""

    @staticmethod
    def _cases() -> list[tuple[str, np.ndarray]]:
        cases = [(datatype, np.resize(array, 1000)) for datatype, array, _ in JSON_CASES]
        special = np.resize(np.array([np.nan, np.inf, -np.inf, 0.1, -0.0], np.float32), 1000)
        cases.append(("FP32", special))
        cases.append(("FP64", special.astype(np.float64)))
        cases.append(("BF16", special.view(np.uint32).astype(np.uint16)))  # truncated floats
        return [(datatype, array) for datatype, array in cases if datatype != "BYTES"]

    def _encode(self, binary_output: bool) -> bytes:
        outputs = [output(f"Y{i}", a, t) for i, (t, a) in enumerate(self._cases())]
        if binary_output:
            outputs.append(output("B", np.arange(3000, dtype=np.int32), "INT32"))
        wanted = OutputFormat(binary={"B": True})
        return encode_infer_response(response(*outputs, id="r"), wanted).body()

    @pytest.mark.parametrize("binary_output", [False, True])
    def test_the_same_bytes_as_one_list(
        self, monkeypatch: pytest.MonkeyPatch, binary_output: bool
    ) -> None:
        from shoal.frontends.http import _json, _tensor_json

        calls: list[int] = []
        dumps = _json.dumps

        def recording(value: Any) -> bytes:
            calls.append(len(value) if isinstance(value, list) else 0)
            return dumps(value)

        monkeypatch.setattr(_json, "dumps", recording)
        monkeypatch.setattr(_tensor_json, "_SLICE", 64)
        in_slices = self._encode(binary_output)
        assert 0 < max(calls[:-1]) <= 64 and len(calls) > 100  # the last: the document
        monkeypatch.setattr(_tensor_json, "_SLICE", 1 << 20)
        assert in_slices == self._encode(binary_output)


def test_binary_heads_are_encoded_once_per_layout() -> None:
    first = encode_infer_response(
        response(output("OUT", np.arange(4, dtype=np.float32), "FP32")), BINARY
    )
    again = encode_infer_response(
        response(output("OUT", np.arange(4, dtype=np.float32) + 1, "FP32")), BINARY
    )
    assert again.headers is first.headers  # the same object: the HTTP head is kept too
    assert split(again) == (split(first)[0], (np.arange(4, dtype=np.float32) + 1).tobytes())
    longer = encode_infer_response(
        response(output("OUT", np.arange(6, dtype=np.float32), "FP32")), BINARY
    )
    assert split(longer)[0]["outputs"][0]["shape"] == [6]
    assert split(longer)[0]["outputs"][0]["parameters"] == {"binary_data_size": 24}


def test_binary_heads_follow_each_bytes_size() -> None:
    for words in ([b"a"], [b"abc"], [b"a"]):
        encoded = encode_infer_response(
            response(output("S", np.array(words, dtype=object), "BYTES")), BINARY
        )
        document, data = split(encoded)
        assert document["outputs"][0]["parameters"] == {"binary_data_size": 4 + len(words[0])}
        assert data == serialize_bytes(np.array(words, dtype=object))


@pytest.mark.parametrize(
    ("fields", "parameters"),
    [({"id": "7"}, {}), ({"parameters": {"p": 1}}, {}), ({}, {"q": 2})],
)
def test_responses_with_more_than_a_layout_are_encoded_whole(
    fields: dict[str, Any], parameters: dict[str, Any]
) -> None:
    plain = encode_infer_response(
        response(output("OUT", np.arange(2, dtype=np.int32), "INT32")), BINARY
    )
    other = response(output("OUT", np.arange(2, dtype=np.int32), "INT32", **parameters), **fields)
    document, data = split(encode_infer_response(other, BINARY))
    assert data == np.arange(2, dtype=np.int32).tobytes()
    assert document != split(plain)[0]
    assert document.get("id") == fields.get("id")


def test_many_layouts_start_the_cache_over() -> None:
    from shoal.frontends.http._response import BINARY_HEADS_MAX

    for count in range(1, BINARY_HEADS_MAX + 3):
        encoded = encode_infer_response(
            response(output("OUT", np.zeros(count, np.uint8), "UINT8")), BINARY
        )
        assert split(encoded)[0]["outputs"][0]["shape"] == [count]
