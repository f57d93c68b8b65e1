"""The plain request reader: which documents it reads, that it reads them as the general walk
does, and that it leaves every other document to the general walk."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from shoal.core import InvalidArgument
from shoal.frontends._binary import BinarySection
from shoal.frontends.http._plain_request import SMALL_DOCUMENT, known_shape, parse_small, read_plain
from shoal.frontends.http.codec import DecodedRequest, decode_infer_request

pytestmark = pytest.mark.timeout(30)

DATA = bytes(range(16))


def binary_input(name: str = "INPUT0", size: int = 16) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "FP32",
        "shape": [1, 4],
        "parameters": {"binary_data_size": size},
    }


def json_input(name: str = "INPUT0") -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [1, 4], "data": [0.5, 1, 2, 3]}


def section(binary: bytes = DATA) -> BinarySection:
    return BinarySection(memoryview(binary), "m", has_header=True)


# What tritonclient and perf_analyzer send, and a few more plain shapes.
PLAIN = [
    {"inputs": [binary_input()], "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}]},
    {"inputs": [binary_input()], "parameters": {"binary_data_output": True}},
    {"inputs": [binary_input()], "outputs": [{"name": "OUT"}], "id": "7", "parameters": {}},
    {"inputs": [json_input()], "outputs": [{"name": "OUT", "parameters": {"binary_data": False}}]},
    {"inputs": [json_input("A"), binary_input("B")], "outputs": []},
    {"inputs": []},
]


def with_binary(document: dict[str, Any]) -> bytes:
    sizes = [e["parameters"]["binary_data_size"] for e in document["inputs"] if "data" not in e]
    return DATA * len(sizes)


@pytest.mark.parametrize("document", PLAIN)
def test_plain_documents_are_read(document: dict[str, Any]) -> None:
    assert read_plain(copy.deepcopy(document), section(with_binary(document))) is not None


def test_a_plain_request_is_what_its_document_says() -> None:
    document = {
        "id": "r1",
        "inputs": [binary_input("A"), json_input("B")],
        "outputs": [{"name": "X", "parameters": {"binary_data": True}}, {"name": "Y"}],
        "parameters": {"binary_data_output": False},
    }
    plain = read_plain(document, section())
    assert plain is not None
    assert (plain.id, plain.binary_default, plain.binary) == ("r1", False, {"X": True})
    assert [output.name for output in plain.outputs] == ["X", "Y"]
    first, second = plain.inputs
    assert (first.name, first.datatype, first.shape, bytes(first.data)) == (
        "A",
        "FP32",
        (1, 4),
        DATA,
    )
    assert second.shape == (1, 4)
    np.testing.assert_array_equal(second.data, np.array([[0.5, 1, 2, 3]], np.float32))
    assert first.parameters == {} and second.parameters == {}


def _changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    document = copy.deepcopy(PLAIN[0])
    target: Any = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document


NOT_PLAIN = [
    _changed(("id",), 7),
    _changed(("sequence_id",), 1),
    _changed(("parameters",), {"priority": 1}),
    _changed(("parameters",), {"binary_data_output": 1}),
    _changed(("parameters",), []),
    _changed(("inputs",), {}),
    _changed(("inputs", 0), "INPUT0"),
    _changed(("inputs", 0, "name"), ""),
    _changed(("inputs", 0, "name"), 3),
    _changed(("inputs", 0, "datatype"), "FP128"),
    _changed(("inputs", 0, "shape"), [1, -4]),
    _changed(("inputs", 0, "shape"), [1, True]),
    _changed(("inputs", 0, "shape"), [1, 4.0]),
    _changed(("inputs", 0, "shape"), "1,4"),
    _changed(("inputs", 0, "data"), [1.0] * 4),
    _changed(("inputs", 0, "extra"), 1),
    _changed(("inputs", 0, "parameters"), {"binary_data_size": -1}),
    _changed(("inputs", 0, "parameters"), {"binary_data_size": 1 << 64}),
    _changed(("inputs", 0, "parameters"), {"binary_data_size": 16.0}),
    _changed(("inputs", 0, "parameters"), {"binary_data_size": 16, "priority": 1}),
    _changed(("inputs", 0, "parameters"), {"shared_memory_region": "r"}),
    _changed(("inputs", 0, "parameters"), []),
    _changed(("inputs",), [binary_input(), binary_input()]),
    _changed(("outputs",), {}),
    _changed(("outputs", 0), "OUT"),
    _changed(("outputs", 0, "name"), ""),
    _changed(("outputs", 0, "parameters"), {}),
    _changed(("outputs", 0, "parameters"), {"binary_data": 1}),
    _changed(("outputs", 0, "parameters"), {"classification": 2}),
    _changed(("outputs", 0, "parameters"), {"shared_memory_region": "r"}),
    _changed(("outputs", 0, "parameters"), {"binary_data": True, "classification": 2}),
    _changed(("outputs", 0, "extra"), 1),
    {"outputs": [{"name": "OUT"}]},
]


@pytest.mark.parametrize("document", NOT_PLAIN)
def test_anything_else_is_left_to_the_general_walk(document: dict[str, Any]) -> None:
    assert read_plain(document, section()) is None


def _decode(document: dict[str, Any], binary: bytes) -> DecodedRequest:
    header = json.dumps(document).encode()
    return decode_infer_request(
        header + binary, model_name="m", model_version="2", header_length=str(len(header))
    )


def _summary(decoded: DecodedRequest) -> Any:
    request = decoded.request
    return (
        request.model_name,
        request.model_version,
        request.id,
        request.parameters,
        [
            (t.name, t.datatype, t.shape, np.asarray(t.data).tobytes(), t.parameters)
            for t in request.inputs
        ],
        [(o.name, o.parameters) for o in request.outputs],
        decoded.output_format.binary_default,
        dict(decoded.output_format.binary),
        decoded.output_format.shared_memory,
    )


@pytest.mark.parametrize("document", [d for d in PLAIN if d.get("outputs")])
def test_both_walks_decode_alike(document: dict[str, Any]) -> None:
    general = copy.deepcopy(document)
    general["outputs"].append({"name": "ZZ", "parameters": {}})  # not plain: the general walk
    plain_request = _summary(_decode(document, with_binary(document)))
    general_request = _summary(_decode(general, with_binary(document)))
    assert general_request[5][-1] == ("ZZ", {})
    general_request[5].pop()
    assert plain_request == general_request


@pytest.mark.parametrize(
    ("binary", "message"),
    [
        (DATA[:8], "unexpected size for input 'INPUT0', expecting 8 additional bytes"),
        (DATA + b"x", "unexpected additional input data for model 'm': 1 bytes after"),
    ],
)
def test_a_plain_request_fails_as_the_general_walk_does(binary: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _decode(PLAIN[0], binary)


def test_small_documents_are_parsed_at_once() -> None:
    assert parse_small(b'{"inputs": []}') == {"inputs": []}
    assert parse_small(memoryview(b'{"a": [1]}')) == {"a": [1]}
    assert parse_small(b'{"a": "\\u00e9\\"["}') == {"a": 'é"['}


def test_a_short_header_is_not_counted_as_it_cannot_nest_too_deep() -> None:
    # Shorter than 202 bytes, a document orjson accepts nests 100 deep at most (an opening
    # and a closing bracket each): its openings in strings do not matter.
    assert parse_small(b'{"a": "' + b"[" * 150 + b'"}') == {"a": "[" * 150}
    deepest = b'{"a": ' + b"[" * 99 + b"]" * 99 + b"}"  # 100 deep, 205 bytes: counted
    assert parse_small(deepest) is not None


@pytest.mark.parametrize(
    "header",
    [
        b"[1]",  # not an object
        b'{"a": NaN}',  # orjson refuses it; the general parser reads it
        b'{"a": "' + b"[" * 201 + b'"}',  # openings in a string count too: too careful
        b'{"a": ' + b"[" * 101 + b"]" * 101 + b"}",  # could nest too deep
        b'{"a": "' + b"x" * SMALL_DOCUMENT + b'"}',  # too long
        b"{",  # malformed: the general parser says why
    ],
)
def test_other_headers_are_parsed_the_general_way(header: bytes) -> None:
    assert parse_small(header) is None


def _header(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


def test_a_repeated_header_is_read_from_its_shape_with_each_body_its_own() -> None:
    document = _changed(("id",), "repeat")
    header = _header(document)
    first = _decode(document, DATA)
    assert known_shape(header) is not None
    other = bytes(reversed(DATA))
    second = _decode(document, other)
    assert bytes(first.request.inputs[0].data) == DATA
    assert bytes(second.request.inputs[0].data) == other
    # Each request has its own objects: nothing of one is shared with the next but the shape.
    assert first.request.inputs is not second.request.inputs
    assert first.request.outputs[0] is not second.request.outputs[0]
    assert first.request.outputs[0].parameters is not second.request.outputs[0].parameters
    assert _summary(first)[5:] == _summary(second)[5:]


def test_a_remembered_header_fails_with_a_wrong_body_as_the_first_time() -> None:
    document = _changed(("id",), "wrong body")
    _decode(document, DATA)
    for binary, message in [
        (DATA[:8], "unexpected size for input 'INPUT0', expecting 8 additional bytes"),
        (DATA + b"x", "unexpected additional input data for model 'm': 1 bytes after"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            _decode(document, binary)


def test_a_header_whose_body_fails_is_not_remembered() -> None:
    document = _changed(("id",), "failed once")
    with pytest.raises(InvalidArgument):
        _decode(document, DATA[:8])
    assert known_shape(_header(document)) is None
    assert bytes(_decode(document, DATA).request.inputs[0].data) == DATA


def test_json_data_and_long_headers_are_not_remembered() -> None:
    json_document = {"id": "json data", "inputs": [json_input()]}
    for _ in range(2):
        decoded = _decode(json_document, b"")
        np.testing.assert_array_equal(decoded.request.inputs[0].data, [[0.5, 1, 2, 3]])
    assert known_shape(_header(json_document)) is None
    long_document = _changed(("id",), "x" * 3000)
    _decode(long_document, DATA)
    assert known_shape(_header(long_document)) is None


def test_remembered_shapes_are_bounded() -> None:
    documents = [_changed(("id",), f"bounded {n}") for n in range(600)]
    for document in documents:
        _decode(document, DATA)
    remembered = sum(known_shape(_header(d)) is not None for d in documents)
    assert 0 < remembered <= 256
    assert known_shape(_header(documents[-1])) is not None
