"""decode_infer_request: JSON and binary inputs, outputs, parameters, and every malformed body."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from shoal.core import InvalidArgument, ShoalError, Unsupported
from shoal.frontends.http.codec import OutputFormat, decode_infer_request
from shoal.ipc.dtypes import serialize_bytes

pytestmark = pytest.mark.timeout(30)


def decode(document: Any, binary: bytes | None = None, **kwargs: Any) -> Any:
    header = json.dumps(document).encode()
    if binary is None:
        return decode_infer_request(header, model_name="m", **kwargs)
    return decode_infer_request(
        header + binary, model_name="m", header_length=str(len(header)), **kwargs
    )


def json_input(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def decode_error(document: Any, binary: bytes | None = None, **kwargs: Any) -> str:
    with pytest.raises(InvalidArgument) as info:
        decode(document, binary, **kwargs)
    return info.value.message


JSON_VALUES = [
    ("BOOL", [True, False], np.bool_),
    ("UINT8", [0, 255], np.uint8),
    ("UINT16", [0, 65535], np.uint16),
    ("UINT32", [0, 2**32 - 1], np.uint32),
    ("UINT64", [0, 2**64 - 1], np.uint64),
    ("UINT64", [2**64 - 1, 2**63], np.uint64),
    ("INT8", [-128, 127], np.int8),
    ("INT16", [-(2**15), 2**15 - 1], np.int16),
    ("INT32", [-(2**31), 2**31 - 1], np.int32),
    ("INT64", [-(2**63), 2**63 - 1], np.int64),
    ("FP16", [1.5, -2], np.float16),
    ("FP32", [0.25, 3], np.float32),
    ("FP64", [1e300, -1], np.float64),
]


class TestJsonInputs:
    @pytest.mark.parametrize(("datatype", "values", "dtype"), JSON_VALUES)
    def test_each_datatype_becomes_an_exact_array(
        self, datatype: str, values: list[Any], dtype: Any
    ) -> None:
        decoded = decode({"inputs": [json_input("X", datatype, [2], values)]})
        (tensor,) = decoded.request.inputs
        assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, (2,))
        assert tensor.data.dtype == np.dtype(dtype)
        assert tensor.data.tolist() == values

    def test_nested_data_is_reshaped_in_row_major_order(self) -> None:
        decoded = decode({"inputs": [json_input("X", "INT32", [2, 3], [[1, 2, 3], [4, 5, 6]])]})
        data = decoded.request.inputs[0].data
        assert data.shape == (2, 3)
        assert data.tolist() == [[1, 2, 3], [4, 5, 6]]

    def test_flat_data_fills_a_nested_shape(self) -> None:
        decoded = decode({"inputs": [json_input("X", "FP32", [2, 2], [1, 2, 3, 4])]})
        assert decoded.request.inputs[0].data.tolist() == [[1, 2], [3, 4]]

    def test_ragged_nesting_counts_elements_like_triton(self) -> None:
        decoded = decode({"inputs": [json_input("X", "INT64", [3], [[1, 2], [3]])]})
        assert decoded.request.inputs[0].data.tolist() == [1, 2, 3]

    def test_bytes_are_utf8_encoded_in_an_object_array(self) -> None:
        decoded = decode({"inputs": [json_input("S", "BYTES", [1, 2], [["abc", "é"]])]})
        data = decoded.request.inputs[0].data
        assert data.dtype == np.object_ and data.shape == (1, 2)
        assert data.tolist() == [[b"abc", "é".encode()]]

    def test_scalar_shape_holds_one_element(self) -> None:
        decoded = decode({"inputs": [json_input("X", "FP64", [], [2.5])]})
        assert decoded.request.inputs[0].data.shape == ()

    def test_empty_tensor(self) -> None:
        decoded = decode({"inputs": [json_input("X", "INT8", [0, 4], [])]})
        assert decoded.request.inputs[0].data.shape == (0, 4)

    def test_fp16_overflow_becomes_infinity_like_triton(self) -> None:
        decoded = decode({"inputs": [json_input("X", "FP16", [1], [1e6])]})
        assert np.isinf(decoded.request.inputs[0].data[0])


class TestBinaryInputs:
    def test_slices_are_zero_copy_read_only_views_of_the_body(self) -> None:
        floats = np.arange(4, dtype=np.float32).tobytes()
        ints = np.array([7, 8], dtype=np.int64).tobytes()
        header = json.dumps(
            {"inputs": [binary_input("A", "FP32", [4], 16), binary_input("B", "INT64", [2], 16)]}
        ).encode()
        body = bytearray(header + floats + ints)
        decoded = decode_infer_request(body, model_name="m", header_length=str(len(header)))
        first, second = decoded.request.inputs
        assert isinstance(first.data, memoryview) and first.data.obj is body
        assert first.data.readonly
        assert bytes(first.data) == floats and bytes(second.data) == ints

    def test_json_and_binary_inputs_mix(self) -> None:
        document = {
            "inputs": [
                json_input("J", "INT32", [1], [5]),
                binary_input("B", "UINT8", [3], 3),
            ]
        }
        decoded = decode(document, b"\x01\x02\x03")
        json_tensor, binary_tensor = decoded.request.inputs
        assert json_tensor.data.tolist() == [5]
        assert bytes(binary_tensor.data) == b"\x01\x02\x03"

    def test_serialized_bytes_stay_serialized(self) -> None:
        raw = serialize_bytes(np.array([b"ab", b"", b"\xff"], dtype=object))
        decoded = decode({"inputs": [binary_input("S", "BYTES", [3], len(raw))]}, raw)
        assert bytes(decoded.request.inputs[0].data) == raw

    def test_zero_size_binary_input(self) -> None:
        decoded = decode({"inputs": [binary_input("E", "FP32", [0], 0)]}, b"")
        assert bytes(decoded.request.inputs[0].data) == b""

    def test_binary_size_is_not_passed_to_the_core(self) -> None:
        entry = binary_input("A", "UINT8", [1], 1)
        entry["parameters"]["custom"] = "kept"
        decoded = decode({"inputs": [entry]}, b"\x00")
        assert decoded.request.inputs[0].parameters == {"custom": "kept"}

    def test_shared_memory_input_passes_its_region_to_the_core(self) -> None:
        region = {"shared_memory_region": "r0", "shared_memory_byte_size": 16}
        entry = {"name": "A", "datatype": "FP32", "shape": [4], "parameters": region}
        tensor = decode({"inputs": [entry]}).request.inputs[0]
        assert tensor.parameters == region and bytes(tensor.data) == b""


class TestRequestFields:
    def test_id_version_and_parameters(self) -> None:
        document = {
            "id": "req-1",
            "inputs": [],
            "parameters": {
                "sequence_id": 7,
                "sequence_start": True,
                "priority": 1,
                "timeout": 100,
                "custom": 1.5,
                "binary_data_output": True,
            },
        }
        request = decode(document, model_version="3").request
        assert (request.model_name, request.model_version, request.id) == ("m", "3", "req-1")
        assert request.parameters == {
            "sequence_id": 7,
            "sequence_start": True,
            "priority": 1,
            "timeout": 100,
            "custom": 1.5,
        }

    def test_string_sequence_id(self) -> None:
        document = {"inputs": [], "parameters": {"sequence_id": "abc"}}
        assert decode(document).request.parameters == {"sequence_id": "abc"}

    def test_outputs_and_their_format(self) -> None:
        document = {
            "inputs": [],
            "parameters": {"binary_data_output": True},
            "outputs": [
                {"name": "A", "parameters": {"binary_data": False}},
                {"name": "B"},
                {"name": "C", "parameters": {"classification": 2}},
                {"name": "D", "parameters": {"shared_memory_region": "r", "binary_data": False}},
            ],
        }
        decoded = decode(document)
        outputs = decoded.request.outputs
        assert [output.name for output in outputs] == ["A", "B", "C", "D"]
        assert outputs[0].parameters == {} and outputs[2].parameters == {"classification": 2}
        assert outputs[3].parameters == {"shared_memory_region": "r"}
        fmt = decoded.output_format
        assert not fmt.is_binary("A") and fmt.is_binary("B") and fmt.is_binary("unlisted")
        assert fmt.shared_memory == frozenset({"D"})

    def test_json_is_the_default_output_format(self) -> None:
        decoded = decode({"inputs": []})
        assert decoded.output_format == OutputFormat()
        assert not decoded.output_format.is_binary("anything")


def raw_decode_error(body: bytes, header_length: str | None = None) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        decode_infer_request(body, model_name="m", header_length=header_length)
    return info.value


class TestBodyErrors:
    def test_bad_json_says_so(self) -> None:
        error = raw_decode_error(b'{"inputs": [')
        assert isinstance(error, InvalidArgument)
        assert error.message.startswith("failed to parse the request JSON buffer")

    def test_non_utf8_json(self) -> None:
        error = raw_decode_error(b'{"id": "\xff"}')
        assert "failed to parse the request JSON buffer" in error.message

    def test_json_must_be_an_object(self) -> None:
        assert "expected a JSON object" in raw_decode_error(b"[1, 2]").message

    @pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
    def test_unparsable_or_negative_header_length(self, value: str) -> None:
        error = raw_decode_error(b'{"inputs": []}', value)
        assert "Inference-Header-Content-Length" in error.message or "range" in error.message

    def test_header_length_beyond_the_body(self) -> None:
        error = raw_decode_error(b'{"inputs": []}', "100")
        assert error.message == "inference header size should be in range (0, 14], got: 100"

    def test_header_cutting_the_json_short(self) -> None:
        error = raw_decode_error(b'{"inputs": []}', "5")
        assert "failed to parse the request JSON buffer" in error.message

    def test_raw_binary_request_is_unsupported(self) -> None:
        assert isinstance(raw_decode_error(b"\x00\x01", "0"), Unsupported)

    def test_binary_input_without_header_length(self) -> None:
        document = {"inputs": [binary_input("A", "UINT8", [1], 1)]}
        message = decode_error(document)
        assert "must specify valid 'Infer-Header-Content-Length'" in message

    def test_too_few_binary_bytes(self) -> None:
        document = {"inputs": [binary_input("A", "FP32", [4], 16)]}
        message = decode_error(document, b"\x00" * 10)
        assert message == (
            "unexpected size for input 'A', expecting 6 additional bytes for model 'm'"
        )

    def test_extra_binary_bytes(self) -> None:
        document = {"inputs": [binary_input("A", "UINT8", [2], 2)]}
        message = decode_error(document, b"\x00" * 5)
        assert message.startswith("unexpected additional input data for model 'm'")
        assert "3 bytes" in message

    def test_binary_bytes_without_binary_inputs(self) -> None:
        message = decode_error({"inputs": [json_input("X", "INT8", [1], [1])]}, b"\x00")
        assert message.startswith("unexpected additional input data for model 'm'")

    def test_fixed_size_mismatch(self) -> None:
        document = {"inputs": [binary_input("A", "FP32", [4], 12)]}
        message = decode_error(document, b"\x00" * 12)
        assert (
            message == "input byte size mismatch for input 'A' for model 'm'. Expected 16, got 12"
        )

    def test_bytes_length_prefix_past_the_end(self) -> None:
        raw = struct.pack("<I", 10) + b"abc"
        message = decode_error({"inputs": [binary_input("S", "BYTES", [1], len(raw))]}, raw)
        assert "element byte size indicator exceeds the end of the buffer" in message
        assert "'S'" in message

    def test_bytes_cut_length_prefix(self) -> None:
        raw = struct.pack("<I", 1) + b"a" + b"\x01\x00"
        message = decode_error({"inputs": [binary_input("S", "BYTES", [2], len(raw))]}, raw)
        assert "element byte size indicator exceeds the end of the buffer" in message

    def test_bytes_element_count_mismatch(self) -> None:
        raw = serialize_bytes(np.array([b"a", b"b"], dtype=object))
        message = decode_error({"inputs": [binary_input("S", "BYTES", [3], len(raw))]}, raw)
        assert message == "expected 3 string elements for inference input 'S' for model 'm', got 2"

    def test_bytes_elements_past_the_shape(self) -> None:
        raw = serialize_bytes(np.array([b"a", b"b", b"c", b"d"], dtype=object))
        message = decode_error({"inputs": [binary_input("S", "BYTES", [2], len(raw))]}, raw)
        assert message == (
            "unexpected number of string elements 3 for inference input 'S' for model 'm', "
            "expecting 2"
        )


def spec_error(entry: dict[str, Any]) -> str:
    return decode_error({"inputs": [entry]})


class TestInputErrors:
    def test_inputs_missing(self) -> None:
        assert decode_error({}).startswith("Unable to parse 'inputs'")

    def test_input_not_an_object(self) -> None:
        assert decode_error({"inputs": [1]}).startswith("Unable to parse 'inputs'")

    def test_missing_name(self) -> None:
        message = spec_error({"datatype": "FP32", "shape": [1], "data": [1]})
        assert message.startswith("Unable to parse 'name'")

    def test_missing_datatype(self) -> None:
        message = spec_error({"name": "X", "shape": [1], "data": [1]})
        assert message == "Unable to parse 'datatype' for input 'X': expected a string"

    def test_unknown_datatype(self) -> None:
        message = spec_error(json_input("X", "FP8", [1], [1]))
        assert message.startswith("invalid datatype for input X: 'FP8' is not one of BOOL")

    @pytest.mark.parametrize("shape", [None, [-1, 2], [1.5], [True], "2"])
    def test_bad_shape(self, shape: Any) -> None:
        entry = {"name": "X", "datatype": "FP32", "data": [1]}
        if shape is not None:
            entry["shape"] = shape
        message = spec_error(entry)
        assert message.startswith("Unable to parse 'shape' for input 'X'")
        assert "non-negative integers" in message

    def test_no_data(self) -> None:
        message = spec_error({"name": "X", "datatype": "FP32", "shape": [1]})
        assert message.startswith("Input must set only one of the following fields")
        assert message.endswith("But no field is set for input 'X'")

    def test_data_and_binary(self) -> None:
        entry = binary_input("X", "UINT8", [1], 1)
        entry["data"] = [1]
        message = decode_error({"inputs": [entry]}, b"\x00")
        assert message.endswith("But set 'data' 'binary_data_size' for input 'X'")

    def test_duplicate_input(self) -> None:
        entry = json_input("X", "INT8", [1], [1])
        assert decode_error({"inputs": [entry, entry]}) == "input 'X' already exists in request"

    def test_data_not_an_array(self) -> None:
        message = spec_error(json_input("X", "INT8", [1], 5))
        assert message == "Unable to parse 'data' for input 'X': expected a JSON array"

    @pytest.mark.parametrize(("shape", "data"), [([2, 3], [1, 2, 3, 4, 5]), ([1], [1, 2])])
    def test_count_mismatch(self, shape: list[int], data: list[int]) -> None:
        message = spec_error(json_input("X", "INT32", shape, data))
        assert message.startswith(
            "Unable to parse 'data': Shape does not match true shape of 'data' field"
        )
        assert f"input 'X': shape {shape}" in message

    @pytest.mark.parametrize(
        ("datatype", "data", "triton", "expected", "got"),
        [
            ("INT32", [1, "abc"], "non-signed-integer as signed-integer", "an integer", '"abc"'),
            ("INT32", [1, 2.5], "non-signed-integer as signed-integer", "an integer", "2.5"),
            ("INT64", [True, False], "non-signed-integer as signed-integer", "an integer", "true"),
            ("UINT64", [1, None], "non-unsigned-integer as unsigned-integer", "an integer", "null"),
            ("BOOL", [1, 0], "non-boolean as boolean", "a boolean", "1"),
            ("FP32", [1.0, None], "non-number as double", "a number", "null"),
            ("FP16", [False], "non-number as double", "a number", "false"),
            ("FP64", ["1.0"], "non-number as double", "a number", '"1.0"'),
            ("BYTES", ["a", 1], "non-string as string", "a string", "1"),
            ("BYTES", [{"a": 1}], "non-string as string", "a string", "an object"),
        ],
    )
    def test_value_of_the_wrong_type_names_input_and_value(
        self, datatype: str, data: list[Any], triton: str, expected: str, got: str
    ) -> None:
        """Triton's words first (its JSON reader's: clients match them), then which value."""
        message = spec_error(json_input("X", datatype, [len(data)], data))
        assert message == (
            f"Unable to parse 'data' for input 'X': attempt to access JSON {triton}: expected "
            f"{expected} for datatype {datatype}, got {got}"
        )

    @pytest.mark.parametrize(
        ("datatype", "value"), [("INT8", 128), ("UINT8", -1), ("UINT64", 2**64), ("INT64", 2**63)]
    )
    def test_integer_out_of_range(self, datatype: str, value: int) -> None:
        message = spec_error(json_input("X", datatype, [1], [value]))
        assert message.startswith(f"Unable to parse 'data' for input 'X': value {value} is out")
        assert datatype in message

    def test_bf16_via_json_is_refused_like_triton(self) -> None:
        message = spec_error(json_input("X", "BF16", [1], [1.0]))
        assert message == (
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            "for input X"
        )

    def test_lone_surrogate_in_bytes(self) -> None:
        # Not valid UTF-8 text: orjson refuses the whole body, the json module the one value.
        message = spec_error(json_input("S", "BYTES", [1], ["\ud800"]))
        assert message.startswith(
            ("failed to parse the request JSON buffer", "Unable to parse 'data' for input 'S'")
        ), message


class TestParameterErrors:
    @pytest.mark.parametrize(
        ("parameters", "expected"),
        [
            ([], "Unable to parse 'parameters'"),
            ({"binary_data_output": 1}, "Unable to parse 'binary_data_output'"),
            ({"priority": -1}, "Unable to parse 'priority'"),
            ({"timeout": "1"}, "Unable to parse 'timeout'"),
            ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
            ({"sequence_end": "yes"}, "Unable to parse 'sequence_end'"),
            ({"custom": [1]}, "parameter 'custom' has invalid type"),
            ({"custom": None}, "parameter 'custom' has invalid type"),
            ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved"),
        ],
    )
    def test_request_parameters(self, parameters: Any, expected: str) -> None:
        assert decode_error({"inputs": [], "parameters": parameters}).startswith(expected)

    def test_id_must_be_a_string(self) -> None:
        assert decode_error({"inputs": [], "id": 5}).startswith("Unable to parse 'id'")

    @pytest.mark.parametrize("size", [-1, "4", True])
    def test_binary_data_size(self, size: Any) -> None:
        entry = {"name": "X", "datatype": "UINT8", "shape": [1], "parameters": {}}
        entry["parameters"]["binary_data_size"] = size
        assert spec_error(entry).startswith("Unable to parse 'binary_data_size'")

    def test_input_parameters_must_be_an_object(self) -> None:
        entry = json_input("X", "UINT8", [1], [1])
        entry["parameters"] = 3
        assert spec_error(entry).startswith("Unable to parse 'parameters' of input 'X'")

    def test_shared_memory_offset(self) -> None:
        region = {"shared_memory_region": "r", "shared_memory_offset": -4}
        entry = {"name": "X", "datatype": "UINT8", "shape": [1], "parameters": region}
        assert spec_error(entry).startswith("Unable to parse 'shared_memory_offset'")

    @pytest.mark.parametrize(
        ("outputs", "expected"),
        [
            ({"name": "A"}, "Unable to parse 'outputs'"),
            ([{"parameters": {}}], "Unable to parse 'name'"),
            ([{"name": "A", "parameters": {"binary_data": "no"}}], "Unable to parse 'binary_data'"),
            (
                [{"name": "A", "parameters": {"shared_memory_region": "r", "binary_data": True}}],
                "Output can't set both 'shared_memory_region' and 'binary_data'",
            ),
            (
                [{"name": "A", "parameters": {"shared_memory_region": "r", "classification": 1}}],
                "Output can't set both 'shared_memory_region' and 'classification'",
            ),
        ],
    )
    def test_outputs(self, outputs: Any, expected: str) -> None:
        assert decode_error({"inputs": [], "outputs": outputs}).startswith(expected)


@pytest.mark.parametrize(
    "raw", [{"custom": -(1 << 63) - 1}, {"custom": 1 << 64}, {"priority": 1 << 64}]
)
def test_a_parameter_wider_than_64_bits_is_refused(raw: dict[str, int]) -> None:
    # orjson reads such literals in an infer body as floats; /generate's parser keeps them ints.
    from shoal.frontends._params import request_parameters

    with pytest.raises(InvalidArgument) as info:
        request_parameters(raw)
    assert info.value.message.startswith(f"parameter '{next(iter(raw))}' is out of range")


def test_parameters_hold_every_64_bit_integer() -> None:
    from shoal.frontends._params import request_parameters

    edges = {"lowest": -(1 << 63), "highest": (1 << 64) - 1, "priority": (1 << 64) - 1}
    assert request_parameters(edges) == (edges, False)
