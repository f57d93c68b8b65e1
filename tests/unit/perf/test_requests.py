"""Requests are serialised once: check the bytes a worker re-sends."""

import json
import struct

import numpy as np
import pytest

from shoal.perf.requests import (
    EMPTY_FINAL_RESPONSE,
    RequestPlan,
    ShmRef,
    grpc_frame,
    grpc_request,
    http_request,
    infer_path,
)
from shoal.perf.tensors import tensor_from_array
from shoal.protos import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(10)

A = tensor_from_array("INPUT0", "FP32", np.arange(4, dtype=np.float32))
B = tensor_from_array("INPUT1", "FP32", np.ones(4, dtype=np.float32))


def _split(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers, body


def test_binary_http_request_is_complete_and_exact():
    raw = http_request(RequestPlan("add_sub", [A, B]), "127.0.0.1:8000")
    request_line, headers, body = _split(raw)
    assert request_line == "POST /v2/models/add_sub/infer HTTP/1.1"
    assert headers["Host"] == "127.0.0.1:8000"
    assert int(headers["Content-Length"]) == len(body)
    header_length = int(headers["Inference-Header-Content-Length"])
    document = json.loads(body[:header_length])
    assert body[header_length:] == A.data + B.data
    assert document["inputs"][0] == {
        "name": "INPUT0",
        "shape": [4],
        "datatype": "FP32",
        "parameters": {"binary_data_size": 16},
    }
    assert document["parameters"] == {"binary_data_output": True}


def test_named_outputs_are_asked_for_in_binary():
    raw = http_request(RequestPlan("add_sub", [A, B], outputs=("OUTPUT0",)), "h:1")
    _, headers, body = _split(raw)
    document = json.loads(body[: int(headers["Inference-Header-Content-Length"])])
    assert document["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    assert "parameters" not in document


def test_json_http_request_carries_the_data():
    raw = http_request(RequestPlan("add_sub", [A, B], version="2"), "h:1", binary=False)
    request_line, headers, body = _split(raw)
    assert request_line == "POST /v2/models/add_sub/versions/2/infer HTTP/1.1"
    assert headers["Content-Type"] == "application/json"
    assert "Inference-Header-Content-Length" not in headers
    document = json.loads(body)
    assert document["inputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0]
    assert "outputs" not in document


def test_shared_memory_inputs_and_outputs_leave_the_body():
    plan = RequestPlan(
        "add_sub",
        [A, B],
        outputs=("OUTPUT0",),
        input_refs={"INPUT0": ShmRef("r", 0, 16), "INPUT1": ShmRef("r", 64, 16)},
        output_refs={"OUTPUT0": ShmRef("r", 128, 16)},
    )
    _, headers, body = _split(http_request(plan, "h:1"))
    assert int(headers["Inference-Header-Content-Length"]) == len(body)  # no binary section
    document = json.loads(body)
    assert document["inputs"][1]["parameters"] == {
        "shared_memory_region": "r",
        "shared_memory_offset": 64,
        "shared_memory_byte_size": 16,
    }
    assert document["outputs"][0]["parameters"]["shared_memory_offset"] == 128


def test_grpc_request_round_trips():
    message = pb.ModelInferRequest.FromString(
        grpc_request(RequestPlan("add_sub", [A, B], outputs=("OUTPUT1",)))
    )
    assert message.model_name == "add_sub"
    assert [(i.name, i.datatype, list(i.shape)) for i in message.inputs] == [
        ("INPUT0", "FP32", [4]),
        ("INPUT1", "FP32", [4]),
    ]
    assert list(message.raw_input_contents) == [A.data, B.data]
    assert [o.name for o in message.outputs] == ["OUTPUT1"]
    assert EMPTY_FINAL_RESPONSE not in message.parameters


def test_streaming_grpc_request_asks_for_the_final_flag():
    message = pb.ModelInferRequest.FromString(grpc_request(RequestPlan("s", [A]), streaming=True))
    assert message.parameters[EMPTY_FINAL_RESPONSE].bool_param is True


def test_grpc_shared_memory_parameters():
    plan = RequestPlan(
        "m",
        [A],
        outputs=("OUT",),
        input_refs={"INPUT0": ShmRef("region", 0, 16)},
        output_refs={"OUT": ShmRef("region", 64, 16)},
    )
    message = pb.ModelInferRequest.FromString(grpc_request(plan))
    assert not message.raw_input_contents
    params = message.inputs[0].parameters
    assert params["shared_memory_region"].string_param == "region"
    assert params["shared_memory_byte_size"].int64_param == 16
    assert message.outputs[0].parameters["shared_memory_offset"].int64_param == 64


def test_grpc_frame_is_length_prefixed():
    frame = grpc_frame(b"abc")
    assert frame[:5] == struct.pack(">BI", 0, 3)
    assert frame[5:] == b"abc"


def test_infer_path():
    assert infer_path("m") == "/v2/models/m/infer"
    assert infer_path("m", "3") == "/v2/models/m/versions/3/infer"
