"""What every HTTP endpoint shares: the error-code table, error and JSON responses, path parsing.

Core errors become ``{"error": "<message>"}`` with the HTTP status of :data:`HTTP_STATUS`, the one
table that maps error codes to statuses; an unexpected exception becomes a 500 with a fixed message
and its traceback goes to the log.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from shoal.core import (
    DecoupledInfer,
    ErrorCode,
    InternalError,
    ShoalError,
)
from shoal.core.versions import check_version
from shoal.frontends._failed_log import infer_failed
from shoal.frontends.http import _json
from shoal.frontends.http._body import ClientDisconnected
from shoal.frontends.http._compression import SUPPORTED_ENCODINGS, UnsupportedEncoding

_logger = logging.getLogger("shoal.frontends.http")

Endpoint = Callable[[Request], Awaitable[Response]]
#: Response headers: a tuple where they are shared (an encoded binary response's), never
#: changed in place.
Headers = Sequence[tuple[str, str]]

JSON_TYPE = "application/json"

#: HTTP status of each core error code. Triton's choices (http_server.cc, HttpCodeFromError) where
#: Triton has the code; RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED are 503 like Triton's own
#: "queue full" and "timeout expired" errors (both UNAVAILABLE there): retry later.
HTTP_STATUS: Mapping[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.RESOURCE_EXHAUSTED: 503,
    ErrorCode.DEADLINE_EXCEEDED: 503,
    ErrorCode.PERMISSION_DENIED: 403,
}


def error_parts(error: ShoalError) -> tuple[int, Headers, bytes]:
    """Status, headers and body of the response to ``error``."""
    headers: list[tuple[str, str]] = [("content-type", JSON_TYPE)]
    if isinstance(error, UnsupportedEncoding):
        headers.append(("accept-encoding", SUPPORTED_ENCODINGS))  # as Triton does
    message = error.http_message if isinstance(error, DecoupledInfer) else error.message
    return HTTP_STATUS.get(error.code, 500), headers, _json.dumps({"error": message})


def infer_error_parts(request_id: str, error: ShoalError) -> tuple[int, Headers, bytes]:
    """:func:`error_parts` of a failed inference request, logged at verbose level as Triton's
    ``HandleInfer`` logs it; ``request_id``: "" before the request's id was read."""
    infer_failed(request_id, error.message)
    return error_parts(error)


async def http_exception(request: Request, exc: Exception) -> Response:
    """Routing errors (404 unknown path, 405 wrong method) in the same JSON form as Triton's."""
    assert isinstance(exc, HTTPException)
    body = _json.dumps({"error": exc.detail})
    return Response(body, status_code=exc.status_code, headers=exc.headers, media_type=JSON_TYPE)


def unexpected(what: str) -> InternalError:
    """Log the exception being handled and return the error the client gets instead."""
    _logger.exception("unexpected error while serving %s", what)
    return InternalError(f"internal error while serving {what}; see the server log")


def error_response(error: ShoalError) -> Response:
    status, headers, body = error_parts(error)
    return Response(body, status_code=status, headers=dict(headers))


def guarded(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with core errors and unexpected exceptions turned into error responses."""

    @functools.wraps(endpoint)
    async def guarded_endpoint(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ClientDisconnected:
            return Response(status_code=400)  # nobody is left to read it
        except ShoalError as exc:
            return error_response(exc)
        except Exception:
            return error_response(unexpected(request.url.path))

    return guarded_endpoint


def json_response(value: Any) -> Response:
    return Response(_json.dumps(value), media_type=JSON_TYPE)


def model_ref(path_params: Mapping[str, Any]) -> tuple[str, str]:
    """The model name and version ("" when absent) of a ``/v2/models/{m}[/versions/{v}]`` path."""
    version: str = path_params.get("model_version", "")
    check_version(version)
    return path_params["model_name"], version
