"""The extension bodies of the HTTP codec: statistics, repository, shared memory, logging, and
infer outputs the core placed in shared memory."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from shoal.core import (
    InferOutput,
    InferResponse,
    InvalidArgument,
    ModelStatistics,
    RepositoryEntry,
    SharedMemoryRegion,
)
from shoal.frontends.http import codec
from shoal.frontends.http.codec import LoadRequest, OutputFormat, RegisterRequest

pytestmark = pytest.mark.timeout(30)

ZERO = {"count": 0, "ns": 0}


def body(document: Any) -> bytes:
    return json.dumps(document).encode()


def invalid(parse: Any, raw: bytes) -> str:
    with pytest.raises(InvalidArgument) as info:
        parse(raw)
    return info.value.message


class TestStatistics:
    def test_a_fresh_model_has_every_field_at_zero(self) -> None:
        assert codec.model_stats_json([ModelStatistics("m", "3")]) == {
            "model_stats": [
                {
                    "name": "m",
                    "version": "3",
                    "last_inference": 0,
                    "inference_count": 0,
                    "execution_count": 0,
                    "inference_stats": {
                        key: ZERO
                        for key in (
                            "success",
                            "fail",
                            "queue",
                            "compute_input",
                            "compute_infer",
                            "compute_output",
                            "cache_hit",
                            "cache_miss",
                        )
                    },
                    "response_stats": {},
                    "batch_stats": [],
                    "memory_usage": [],
                }
            ]
        }

    def test_no_models(self) -> None:
        assert codec.model_stats_json([]) == {"model_stats": []}


class TestRepository:
    def test_index_leaves_out_empty_fields(self) -> None:
        entries = [
            RepositoryEntry("a", "1", "READY"),
            RepositoryEntry("b", "", "UNAVAILABLE", "no versions"),
            RepositoryEntry("c"),
        ]
        assert codec.repository_index_json(entries) == [
            {"name": "a", "version": "1", "state": "READY"},
            {"name": "b", "state": "UNAVAILABLE", "reason": "no versions"},
            {"name": "c"},
        ]

    @pytest.mark.parametrize(
        ("raw", "ready"),
        [(b"", False), (b"{}", False), (body({"ready": True}), True), (body({"x": 1}), False)],
    )
    def test_index_request(self, raw: bytes, ready: bool) -> None:
        assert codec.parse_index_request(raw) is ready

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            (b"[]", "failed to parse the request JSON buffer: expected a JSON object"),
            (body({"ready": 1}), "Unable to parse 'ready': expected a boolean"),
        ],
    )
    def test_bad_index_request(self, raw: bytes, message: str) -> None:
        assert invalid(codec.parse_index_request, raw) == message

    def test_load_request_without_parameters(self) -> None:
        assert codec.parse_load_request(b"") == LoadRequest(None, None)
        assert codec.parse_load_request(b"{}") == LoadRequest(None, None)
        assert codec.parse_load_request(body({"parameters": {}})) == LoadRequest(None, None)

    def test_load_request_decodes_files(self) -> None:
        content = bytes(range(256))
        parameters = {
            "config": '{"backend": "python"}',
            "file:1/model.py": base64.b64encode(content).decode(),
            "file:empty": "",
        }
        assert codec.parse_load_request(body({"parameters": parameters})) == LoadRequest(
            '{"backend": "python"}', {"file:1/model.py": content, "file:empty": b""}
        )

    @pytest.mark.parametrize(
        ("parameters", "message"),
        [
            ([], "Unable to parse 'parameters': expected a JSON object"),
            ({"config": None}, "Unable to parse 'config': expected a string"),
            ({"file:a": 12}, "Unable to parse 'file:a': expected a string"),
            ({"file:a": "@@"}, "Unable to parse 'file:a': invalid base64 content"),
            ({"other": "x"}, "unexpected load parameter 'other'"),
        ],
    )
    def test_bad_load_request(self, parameters: Any, message: str) -> None:
        raw = body({"parameters": parameters})
        assert invalid(codec.parse_load_request, raw).startswith(message)

    @pytest.mark.parametrize(
        ("raw", "dependents"),
        [
            (b"", False),
            (body({"parameters": {}}), False),
            (body({"parameters": {"unload_dependents": True}}), True),
        ],
    )
    def test_unload_request(self, raw: bytes, dependents: bool) -> None:
        assert codec.parse_unload_request(raw) is dependents


class TestSharedMemory:
    def test_register_offset_defaults_to_zero(self) -> None:
        raw = body({"key": "/k", "byte_size": 8})
        assert codec.parse_register_request(raw) == RegisterRequest("/k", 0, 8)

    def test_register_with_offset(self) -> None:
        raw = body({"key": "/k", "offset": 4, "byte_size": 8})
        assert codec.parse_register_request(raw) == RegisterRequest("/k", 4, 8)

    def test_empty_register_body_names_the_missing_key(self) -> None:
        message = invalid(codec.parse_register_request, b"")
        assert message == "Shared memory register request has no 'key' field"

    def test_bool_is_not_a_size(self) -> None:
        raw = body({"key": "/k", "byte_size": True})
        message = invalid(codec.parse_register_request, raw)
        assert message == "Unable to parse 'byte_size': expected a non-negative integer"

    def test_status(self) -> None:
        regions = [SharedMemoryRegion("r", "/k", 4, 8)]
        assert codec.shm_status_json(regions) == [
            {"name": "r", "key": "/k", "offset": 4, "byte_size": 8}
        ]


class TestLogSettings:
    def test_nulls_are_dropped_and_scalars_kept(self) -> None:
        raw = body({"log_file": None, "log_info": False, "log_verbose_level": 3, "log_format": "x"})
        assert codec.parse_log_settings(raw) == {
            "log_info": False,
            "log_verbose_level": 3,
            "log_format": "x",
        }

    @pytest.mark.parametrize("value", [1.5, [1], {"a": 1}])
    def test_other_values_are_refused(self, value: Any) -> None:
        message = invalid(codec.parse_log_settings, body({"log_info": value}))
        assert message == "Unable to parse 'log_info': expected a boolean, an integer or a string"


class TestSharedMemoryOutputs:
    def test_an_output_the_core_placed_in_shared_memory_carries_no_data(self) -> None:
        parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
        out = InferOutput("S", "FP32", (4,), memoryview(b""), dict(parameters))
        encoded = codec.encode_infer_response(
            InferResponse("m", "1", outputs=[out]), OutputFormat(binary_default=True)
        )
        assert dict(encoded.headers) == {"content-type": "application/json"}
        # No shared_memory_* parameters, as Triton: perf_analyzer's C++ client reads an output's
        # "parameters" as holding binary_data_size.
        assert json.loads(encoded.body())["outputs"] == [
            {"name": "S", "datatype": "FP32", "shape": [4]}
        ]

    def test_a_requested_shm_output_without_parameters_has_none(self) -> None:
        out = InferOutput("S", "FP32", (4,), memoryview(b""))
        fmt = OutputFormat(shared_memory=frozenset({"S"}))
        encoded = codec.encode_infer_response(InferResponse("m", "1", outputs=[out]), fmt)
        assert json.loads(encoded.body())["outputs"] == [
            {"name": "S", "datatype": "FP32", "shape": [4]}
        ]
