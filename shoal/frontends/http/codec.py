"""The HTTP/REST frontend's codec: KServe V2 JSON and binary bodies <-> core objects.

Pure functions, no I/O, so that every path can be tested without a server:

* :func:`decode_infer_request` turns an infer body (JSON, or JSON header + binary tensor data) into
  the core's :class:`~shoal.core.api.InferRequest` plus the client's :class:`OutputFormat`;
* :func:`encode_infer_response` turns an :class:`~shoal.core.api.InferResponse` into headers
  and body chunks;
* :func:`request_encoding` / :func:`decompress` and :func:`response_encoding` / :func:`compress`
  handle ``Content-Encoding`` and ``Accept-Encoding`` (gzip, deflate);
* :func:`server_metadata_json` / :func:`model_metadata_json` render the metadata endpoints;
* the protocol extensions' bodies: :func:`model_stats_json` (statistics),
  :func:`parse_index_request` / :func:`repository_index_json`, :func:`parse_load_request`,
  :func:`parse_unload_request` (model repository), :func:`parse_register_request` /
  :func:`shm_status_json` (system shared memory) and :func:`parse_log_settings` (logging).

Every malformed input raises :class:`~shoal.core.api.InvalidArgument` (or ``Unsupported``)
with a message that names the input and what was expected.
"""

from __future__ import annotations

from typing import Any

from shoal.core import ModelMetadata, ServerMetadata, TensorMetadata
from shoal.frontends._limits import DEFAULT_MAX_INPUT_SIZE, too_large
from shoal.frontends.http._compression import (
    SUPPORTED_ENCODINGS,
    UnsupportedEncoding,
    compress,
    decompress,
    inflate,
    request_encoding,
    response_encoding,
)
from shoal.frontends.http._log_settings import parse_log_settings
from shoal.frontends.http._repository import (
    LoadRequest,
    parse_index_request,
    parse_load_request,
    parse_unload_request,
    repository_index_json,
)
from shoal.frontends.http._request import (
    ConfigOf,
    DecodedRequest,
    OutputFormat,
    decode_infer_request,
    parse_header_length,
)
from shoal.frontends.http._response import (
    HEADER_LENGTH,
    LEND_MIN,
    Body,
    EncodedResponse,
    LentBody,
    body_batches,
    body_length,
    encode_infer_response,
    json_output_bytes,
)
from shoal.frontends.http._shared_memory import (
    RegisterRequest,
    parse_register_request,
    shm_status_json,
)
from shoal.frontends.http._statistics import model_stats_json

__all__ = [
    "DEFAULT_MAX_INPUT_SIZE",
    "HEADER_LENGTH",
    "LEND_MIN",
    "SUPPORTED_ENCODINGS",
    "Body",
    "ConfigOf",
    "DecodedRequest",
    "EncodedResponse",
    "LentBody",
    "LoadRequest",
    "OutputFormat",
    "RegisterRequest",
    "UnsupportedEncoding",
    "body_batches",
    "body_length",
    "compress",
    "decode_infer_request",
    "decompress",
    "encode_infer_response",
    "inflate",
    "json_output_bytes",
    "model_metadata_json",
    "model_stats_json",
    "parse_header_length",
    "parse_index_request",
    "parse_load_request",
    "parse_log_settings",
    "parse_register_request",
    "parse_unload_request",
    "repository_index_json",
    "request_encoding",
    "response_encoding",
    "server_metadata_json",
    "shm_status_json",
    "too_large",
]


def server_metadata_json(metadata: ServerMetadata) -> dict[str, Any]:
    """``GET /v2``'s body."""
    return {
        "name": metadata.name,
        "version": metadata.version,
        "extensions": list(metadata.extensions),
    }


def model_metadata_json(metadata: ModelMetadata) -> dict[str, Any]:
    """``GET /v2/models/{m}``'s body."""
    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [_tensor_metadata_json(tensor) for tensor in metadata.inputs],
        "outputs": [_tensor_metadata_json(tensor) for tensor in metadata.outputs],
    }


def _tensor_metadata_json(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
