"""A JSON response with large arrays is returned as pieces: together, byte for byte the document
that one dumps of the whole writes; small responses stay one piece."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shoal.core import InferOutput, InferResponse
from shoal.frontends.http import _json
from shoal.frontends.http._tensor_json import _values
from shoal.frontends.http.codec import (
    OutputFormat,
    body_batches,
    body_length,
    encode_infer_response,
)
from shoal.ipc.dtypes import serialize_bytes

pytestmark = pytest.mark.timeout(60)

LARGE = 70_000  # past one encoding slice (65,536 values)


def _output(name: str, array: np.ndarray, datatype: str, **parameters: Any) -> InferOutput:
    raw = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
    return InferOutput(name, datatype, array.shape, memoryview(raw), parameters)


def _floats(dtype: type) -> np.ndarray:
    values = np.linspace(-3.0, 3.0, LARGE).astype(dtype)
    values[[5, 70, 69_999]] = [np.nan, np.inf, -np.inf]
    return values


def _outputs() -> list[InferOutput]:
    return [
        _output("SMALL", np.array([1.5, -2.25], np.float32), "FP32"),
        _output("HALF", _floats(np.float16), "FP16", note="large"),
        _output("FLAGS", np.arange(LARGE) % 3 == 0, "BOOL"),
        _output("WORDS", np.array([b"a", "é".encode()], np.object_), "BYTES"),
        _output("RAW", np.arange(LARGE, dtype=np.int64), "INT64"),
        _output("WIDE", _floats(np.float64).reshape(10, -1), "FP64"),
    ]


def _response() -> InferResponse:
    return InferResponse("m", "1", id="req-1", outputs=_outputs(), parameters={"p": 3})


def _whole_document(output_format: OutputFormat) -> bytes:
    """What one dumps of the whole document writes (the values as plain lists): the reference."""
    document: dict[str, Any] = {"id": "req-1", "model_name": "m", "model_version": "1"}
    document["parameters"] = {"p": 3}
    entries = []
    for output in _outputs():
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype}
        entry["shape"] = list(output.shape)
        parameters = dict(output.parameters)
        data = memoryview(output.data).cast("B")
        if output_format.is_binary(output.name):
            entry["parameters"] = {**parameters, "binary_data_size": data.nbytes}
        else:
            if parameters:
                entry["parameters"] = parameters
            entry["data"] = (
                ["a", "é"] if output.datatype == "BYTES" else _values(output.datatype, data)
            )
        entries.append(entry)
    document["outputs"] = entries
    return _json.dumps(document)


def test_json_pieces_are_the_whole_document_byte_for_byte() -> None:
    encoded = encode_infer_response(_response(), OutputFormat())
    assert encoded.owned and len(encoded.chunks) > 4  # pieces, sent as they are
    payload = encoded.payload()
    assert isinstance(payload, tuple)
    assert b"".join(payload) == _whole_document(OutputFormat())
    assert body_length(payload) == len(_whole_document(OutputFormat()))


def test_json_pieces_with_binary_outputs_join_under_a_right_header_length() -> None:
    output_format = OutputFormat(binary={"RAW": True, "SMALL": True})
    encoded = encode_infer_response(_response(), output_format)
    header = _whole_document(output_format)
    assert not encoded.owned  # binary outputs view the response's memory: joined
    assert dict(encoded.headers)["inference-header-content-length"] == str(len(header))
    raw = np.arange(LARGE, dtype=np.int64).tobytes()
    small = np.array([1.5, -2.25], np.float32).tobytes()
    assert encoded.payload() == header + small + raw


def test_small_json_response_is_one_piece() -> None:
    small = InferResponse(
        "m", "1", outputs=[_output("A", np.arange(65_536, dtype=np.int32), "INT32")]
    )
    encoded = encode_infer_response(small, OutputFormat())
    assert not encoded.owned
    assert isinstance(encoded.payload(), bytes)


def test_batches_keep_order_and_bound_each_write() -> None:
    pieces = tuple(bytes([i]) * size for i, size in enumerate([100_000, 200_000, 5, 300_000, 7]))
    batches = body_batches(pieces)
    assert [piece for batch in batches for piece in batch] == list(pieces)
    assert [len(batch) for batch in batches] == [2, 2, 1]  # 256 KiB or more, then a new one
