"""Triton's restricted APIs (HTTP) and protocols (gRPC): groups of endpoints that answer only
calls carrying a given header (HTTP) or metadata key (gRPC) with a given value.

``--http-restricted-api=<group>[,<group>...]:<key>=<value>`` makes every HTTP route of those groups
check header ``<key>``; ``--grpc-restricted-protocol`` makes every RPC of its groups check
metadata key ``triton-grpc-protocol-<key>``, as Triton does. :data:`HTTP_GROUPS` and
:data:`GRPC_GROUPS` are the one table of which route or RPC belongs to which group. A call without
the expected value fails with PERMISSION_DENIED (HTTP 403) and Triton's message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from shoal.core import ErrorCode, ShoalError
from shoal.frontends.http._endpoint import error_parts

#: Triton's group names (RESTRICTED_CATEGORY_NAMES), in Triton's order.
GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

#: What Triton puts before a gRPC restricted key (metadata keys are lowercase on HTTP/2).
GRPC_KEY_PREFIX = "triton-grpc-protocol-"

_MODEL = "/v2/models/{model_name}"
_VERSION = _MODEL + "/versions/{model_version}"
_PER_MODEL = {
    "": "metadata",
    "/ready": "health",
    "/config": "model-config",
    "/infer": "inference",
    "/generate": "inference",
    "/generate_stream": "inference",
    "/stats": "statistics",
}
_SHM_ROUTES = (
    prefix + region + action
    for prefix in ("/v2/systemsharedmemory", "/v2/cudasharedmemory")
    for region in ("", "/region/{region_name}")
    for action in ("/status", "/register", "/unregister")
)

#: Route path (as the HTTP routes declare it) -> group, as Triton's http_server.cc checks them.
HTTP_GROUPS: Mapping[str, str] = {
    "/v2/health/live": "health",
    "/v2/health/ready": "health",
    "/v2": "metadata",
    "/v2/models/stats": "statistics",
    **{
        model + suffix: group
        for model in (_MODEL, _VERSION)
        for suffix, group in _PER_MODEL.items()
    },
    "/v2/repository/index": "model-repository",
    "/v2/repository/models/{model_name}/load": "model-repository",
    "/v2/repository/models/{model_name}/unload": "model-repository",
    # Named repositories (refused, 501) are restricted first, as Triton matches them with the rest.
    "/v2/repository/{repository_name}/index": "model-repository",
    "/v2/repository/{repository_name}/models/{model_name}/load": "model-repository",
    "/v2/repository/{repository_name}/models/{model_name}/unload": "model-repository",
    **dict.fromkeys(_SHM_ROUTES, "shared-memory"),
    "/v2/trace/setting": "trace",
    _MODEL + "/trace/setting": "trace",
    "/v2/logging": "logging",
}

#: RPC of ``inference.GRPCInferenceService`` -> group, as Triton's grpc_server.cc checks them.
GRPC_GROUPS: Mapping[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


class Restrictions:
    """The groups one frontend restricts, each with the key and value its calls must carry.

    ``groups`` maps a group name to ``(key, value)``; ``prefix`` goes before every key (gRPC:
    :data:`GRPC_KEY_PREFIX`). Keys match case-insensitively (HTTP/2 lowercases them), values
    exactly. Raises ``ValueError`` for a group Triton does not have.
    """

    def __init__(
        self, groups: Mapping[str, tuple[str, str]], *, prefix: str = "", what: str = "API"
    ) -> None:
        unknown = sorted(set(groups) - set(GROUPS))
        if unknown:
            raise ValueError(f"unknown restricted {what.lower()} group(s): {', '.join(unknown)}")
        self._required = {group: (prefix + key, value) for group, (key, value) in groups.items()}
        self._what = what

    def __bool__(self) -> bool:
        return bool(self._required)

    def restricts(self, group: str) -> bool:
        return group in self._required

    def check(self, group: str, headers: Iterable[tuple[str, object]]) -> None:
        """Raise PERMISSION_DENIED unless ``group`` is open or ``headers`` carry its value.

        As Triton, only the first header with the key counts.
        """
        required = self._required.get(group)
        if required is None:
            return
        key, value = required
        if _first_header(headers, key.lower()) == value:
            return
        raise ShoalError(
            f"This {self._what} is restricted, expecting header '{key}'",
            ErrorCode.PERMISSION_DENIED,
        )


def restrict_routes(routes: Sequence[BaseRoute], restrictions: Restrictions) -> list[BaseRoute]:
    """``routes`` with each route of a restricted group checking its header first.

    Raises ``ValueError`` for a route that :data:`HTTP_GROUPS` does not place in a group, so that
    a new route cannot slip past the restrictions.
    """
    if not restrictions:
        return list(routes)
    return [_restricted_route(route, restrictions) for route in routes]


def _first_header(headers: Iterable[tuple[str, object]], wanted: str) -> object:
    """The value of the first header named ``wanted`` (lower case), as Triton reads it."""
    for name, given in headers:
        if name.lower() == wanted:
            return given
    return None


def _restricted_route(route: BaseRoute, restrictions: Restrictions) -> BaseRoute:
    if not isinstance(route, Route) or route.path not in HTTP_GROUPS:
        path = getattr(route, "path", repr(route))
        raise ValueError(f"the HTTP route {path} belongs to no restricted API group")
    group = HTTP_GROUPS[route.path]
    if not restrictions.restricts(group):
        return route
    guard = _Guard(route.app, group, restrictions)
    return Route(route.path, guard, methods=route.methods, name=route.name)


class _Guard:
    """An ASGI app that answers 403 unless the request carries its group's header."""

    def __init__(self, app: ASGIApp, group: str, restrictions: Restrictions) -> None:
        self._app = app
        self._group = group
        self._restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
        try:
            self._restrictions.check(self._group, headers)
        except ShoalError as exc:
            await _refuse(send, exc)
            return
        await self._app(scope, receive, send)


async def _refuse(send: Send, exc: ShoalError) -> None:
    status, response_headers, body = error_parts(exc)
    raw = [(b"content-length", str(len(body)).encode("latin-1"))]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response_headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
