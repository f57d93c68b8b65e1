"""The control plane of a run, over the run's own protocol: model metadata and configuration,
one probe request, and system shared-memory registration. Blocking calls, made before and after
the load, never during it.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.perf.errors import PerfError
from shoal.perf.requests import RequestPlan, grpc_request, http_request
from shoal.perf.tensors import TensorInfo
from shoal.protos import grpc_service_pb2 as pb

_SERVICE = "/inference.GRPCInferenceService/"
_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ModelInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    decoupled: bool


@dataclass(frozen=True)
class OutputInfo:
    """An output as the probe request returned it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    nbytes: int


class ControlClient(Protocol):
    def model_info(self, model: str, version: str) -> ModelInfo: ...

    def probe(self, plan: RequestPlan) -> tuple[OutputInfo, ...]: ...

    def register_shm(self, name: str, key: str, byte_size: int) -> None: ...

    def unregister_shm(self, name: str) -> None: ...

    def close(self) -> None: ...


def split_address(url: str, default_port: int) -> tuple[str, int]:
    """``http://host:port``, ``host:port`` or ``host`` -> (host, port)."""
    address = url.split("://", 1)[-1].rstrip("/")
    host, colon, port = address.rpartition(":")
    if not colon or "]" in port:
        return address.strip("[]"), default_port
    if not port.isdigit():
        raise PerfError(f"bad port in '{url}'")
    return host.strip("[]"), int(port)


class HttpControl:
    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._connection = http.client.HTTPConnection(host, port, timeout=_TIMEOUT_S)

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, http.client.HTTPResponse]:
        try:
            self._connection.request(method, path, body=body, headers=headers or {})
            response = self._connection.getresponse()
            data = response.read()
        except OSError as error:
            self._connection.close()
            raise PerfError(f"{self._host}:{self._port}: {error}") from error
        return response.status, data, response

    def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        status, data, _ = self._call(method, path, body)
        if status != 200:
            raise PerfError(
                f"{method} {path}: HTTP {status}: {data[:300].decode(errors='replace')}"
            )
        return json.loads(data) if data else {}

    def model_info(self, model: str, version: str) -> ModelInfo:
        base = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        metadata = self._json("GET", base)
        config = self._json("GET", f"{base}/config")
        policy = config.get("model_transaction_policy") or {}
        return ModelInfo(
            inputs=tuple(_info(t) for t in metadata.get("inputs", [])),
            outputs=tuple(_info(t) for t in metadata.get("outputs", [])),
            max_batch_size=int(config.get("max_batch_size", 0)),
            decoupled=bool(policy.get("decoupled", False)),
        )

    def probe(self, plan: RequestPlan) -> tuple[OutputInfo, ...]:
        raw = http_request(plan, f"{self._host}:{self._port}", binary=True)
        status, data, response = self._call("POST", *_split_request(raw))
        if status != 200:
            text = data[:300].decode(errors="replace")
            raise PerfError(f"probe request failed: HTTP {status}: {text}")
        document = _json_header(data, response)
        return tuple(_http_output(o) for o in document.get("outputs", []))

    def register_shm(self, name: str, key: str, byte_size: int) -> None:
        body = json.dumps({"key": key, "offset": 0, "byte_size": byte_size}).encode()
        self._json("POST", f"/v2/systemsharedmemory/region/{name}/register", body)

    def unregister_shm(self, name: str) -> None:
        self._json("POST", f"/v2/systemsharedmemory/region/{name}/unregister")

    def close(self) -> None:
        self._connection.close()


def _split_request(raw: bytes) -> tuple[str, bytes, dict[str, str]]:
    """The path, body and headers of a raw HTTP/1.1 request."""
    head, _, body = raw.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    return head.split(b" ", 2)[1].decode(), body, headers


def _json_header(data: bytes, response: http.client.HTTPResponse) -> Any:
    """The JSON part of a response (all of it when it carries no binary outputs)."""
    header_length = response.getheader("Inference-Header-Content-Length")
    return json.loads(data[: int(header_length)] if header_length else data)


def _info(entry: dict[str, Any]) -> TensorInfo:
    return TensorInfo(str(entry["name"]), str(entry["datatype"]), tuple(entry["shape"]))


def _http_output(entry: dict[str, Any]) -> OutputInfo:
    parameters = entry.get("parameters") or {}
    size = int(parameters.get("binary_data_size", 0))
    return OutputInfo(entry["name"], entry["datatype"], tuple(entry["shape"]), size)


def _tensor_infos(tensors: Any) -> tuple[TensorInfo, ...]:
    return tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in tensors)


class GrpcControl:
    def __init__(self, host: str, port: int) -> None:
        import grpc  # type: ignore[import-untyped]

        self._grpc = grpc
        self._channel = grpc.insecure_channel(
            f"{host}:{port}",
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )

    def _call(self, method: str, request: Any, response_type: Any) -> Any:
        call = self._channel.unary_unary(
            _SERVICE + method,
            request_serializer=None,
            response_deserializer=response_type.FromString,
        )
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        try:
            return call(payload, timeout=_TIMEOUT_S)
        except self._grpc.RpcError as error:
            raise PerfError(f"{method}: {error.code().name}: {error.details()}") from error

    def model_info(self, model: str, version: str) -> ModelInfo:
        metadata = self._metadata(model, version)
        config = self._config(model, version)
        return ModelInfo(
            inputs=_tensor_infos(metadata.inputs),
            outputs=_tensor_infos(metadata.outputs),
            max_batch_size=int(config.max_batch_size),
            decoupled=bool(config.model_transaction_policy.decoupled),
        )

    def _metadata(self, model: str, version: str) -> Any:
        request = pb.ModelMetadataRequest(name=model, version=version)
        return self._call("ModelMetadata", request, pb.ModelMetadataResponse)

    def _config(self, model: str, version: str) -> Any:
        request = pb.ModelConfigRequest(name=model, version=version)
        return self._call("ModelConfig", request, pb.ModelConfigResponse).config

    def probe(self, plan: RequestPlan) -> tuple[OutputInfo, ...]:
        response = self._call("ModelInfer", grpc_request(plan), pb.ModelInferResponse)
        sizes = [len(raw) for raw in response.raw_output_contents]
        sizes += [0] * (len(response.outputs) - len(sizes))
        return tuple(
            OutputInfo(o.name, o.datatype, tuple(o.shape), size)
            for o, size in zip(response.outputs, sizes, strict=True)
        )

    def register_shm(self, name: str, key: str, byte_size: int) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=byte_size)
        self._call("SystemSharedMemoryRegister", request, pb.SystemSharedMemoryRegisterResponse)

    def unregister_shm(self, name: str) -> None:
        request = pb.SystemSharedMemoryUnregisterRequest(name=name)
        self._call("SystemSharedMemoryUnregister", request, pb.SystemSharedMemoryUnregisterResponse)

    def close(self) -> None:
        self._channel.close()


def control_client(protocol: str, host: str, port: int) -> ControlClient:
    if protocol == "grpc":
        return GrpcControl(host, port)
    return HttpControl(host, port)
