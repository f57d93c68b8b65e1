"""Requests serialised once: the exact HTTP/1.1 bytes, or a ModelInferRequest message.

A worker re-sends the same bytes for the whole run, so the client's cost per request is one write
and one read. Inputs and outputs can point at system shared-memory regions instead of carrying data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.perf.tensors import TensorSpec
from shoal.protos import grpc_service_pb2 as pb

#: Parameter that asks a decoupled model's stream to flag its last response.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"


@dataclass(frozen=True)
class ShmRef:
    """Where a tensor lives in a registered system shared-memory region."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        return {
            "shared_memory_region": self.region,
            "shared_memory_offset": self.offset,
            "shared_memory_byte_size": self.byte_size,
        }


@dataclass(frozen=True)
class RequestPlan:
    """Everything one serialised request says.

    ``outputs`` names the outputs to ask for (empty: every output, the server's choice of form);
    ``input_refs`` and ``output_refs`` place tensors in shared memory by name.
    """

    model: str
    inputs: Sequence[TensorSpec]
    version: str = ""
    outputs: Sequence[str] = ()
    input_refs: Mapping[str, ShmRef] = field(default_factory=dict)
    output_refs: Mapping[str, ShmRef] = field(default_factory=dict)

    @property
    def payload_bytes(self) -> int:
        return sum(t.nbytes for t in self.inputs)


def infer_path(model: str, version: str = "") -> str:
    base = f"/v2/models/{model}"
    return f"{base}/versions/{version}/infer" if version else f"{base}/infer"


def http_request(plan: RequestPlan, host: str, *, binary: bool = True) -> bytes:
    """The complete HTTP/1.1 request (request line, headers and body) for ``plan``.

    ``binary`` sends inputs after the JSON header (Triton's binary tensor extension) and asks for
    binary outputs; otherwise inputs and outputs are JSON.
    """
    header = _http_header(plan, binary=binary)
    if binary:
        data = [t.data for t in plan.inputs if t.name not in plan.input_refs]
        body = b"".join([header, *data])
        extra = f"Inference-Header-Content-Length: {len(header)}\r\n"
        content_type = "application/octet-stream"
    else:
        body, extra, content_type = header, "", "application/json"
    head = (
        f"POST {infer_path(plan.model, plan.version)} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"{extra}"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("ascii") + body


def _http_header(plan: RequestPlan, *, binary: bool) -> bytes:
    inputs = []
    for tensor in plan.inputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
        }
        ref = plan.input_refs.get(tensor.name)
        if ref is not None:
            entry["parameters"] = ref.parameters()
        elif binary:
            entry["parameters"] = {"binary_data_size": tensor.nbytes}
        else:
            entry["data"] = tensor.json_data()
        inputs.append(entry)
    document: dict[str, Any] = {"inputs": inputs}
    if plan.outputs:
        document["outputs"] = [_http_output(name, plan, binary) for name in plan.outputs]
    elif binary:
        document["parameters"] = {"binary_data_output": True}
    return json.dumps(document, separators=(",", ":")).encode()


def _http_output(name: str, plan: RequestPlan, binary: bool) -> dict[str, Any]:
    ref = plan.output_refs.get(name)
    if ref is not None:
        return {"name": name, "parameters": ref.parameters()}
    return {"name": name, "parameters": {"binary_data": binary}}


def grpc_request(plan: RequestPlan, *, streaming: bool = False) -> bytes:
    """A serialised ``inference.ModelInferRequest`` for ``plan``.

    ``streaming`` asks for the empty final response that tells a stream's client a request is
    complete (``ModelStreamInfer`` on decoupled models).
    """
    request = pb.ModelInferRequest(model_name=plan.model, model_version=plan.version)
    for tensor in plan.inputs:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype)
        entry.shape.extend(tensor.shape)
        ref = plan.input_refs.get(tensor.name)
        if ref is None:
            request.raw_input_contents.append(tensor.data)
        else:
            _set_parameters(entry.parameters, ref.parameters())
    for name in plan.outputs:
        output = request.outputs.add(name=name)
        ref = plan.output_refs.get(name)
        if ref is not None:
            _set_parameters(output.parameters, ref.parameters())
    if streaming:
        request.parameters[EMPTY_FINAL_RESPONSE].bool_param = True
    return request.SerializeToString()


def _set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = str(value)


def grpc_frame(message: bytes) -> bytes:
    """``message`` as one gRPC length-prefixed frame (what h2load sends as the request body)."""
    return struct.pack(">BI", 0, len(message)) + message
