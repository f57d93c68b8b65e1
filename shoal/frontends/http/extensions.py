"""The endpoints of Triton's protocol extensions: statistics, model repository, shared memory,
logging.

Each endpoint parses its (small) body with :mod:`shoal.frontends.http.codec`, calls one
:class:`~shoal.core.ExtensionAPI` method and renders the result. A core whose method raises
``NotImplementedError`` gets 501 "<extension> is not supported by this server" instead of a crash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shoal.core import CoreAPI, InvalidArgument, Unsupported
from shoal.frontends.http import codec
from shoal.frontends.http._body import read_body
from shoal.frontends.http._endpoint import Endpoint, guarded, json_response, model_ref
from shoal.frontends.http._shared_memory import cuda_shm_status_json, parse_cuda_register_request
from shoal.frontends.http._trace_settings import parse_trace_settings

_MODEL = "/v2/models/{model_name}"
_VERSION = "/v2/models/{model_name}/versions/{model_version}"
_REPOSITORY = "/v2/repository"
_SYSTEM_SHM = "/v2/systemsharedmemory"
_CUDA_SHM = "/v2/cudasharedmemory"
_REGION = "/region/{region_name}"


def model_stats_routes(core: CoreAPI) -> list[Route]:
    """The statistics routes; they must come before ``/v2/models/{model_name}``."""
    stats = _extension("statistics")(_model_stats(core))
    return [
        Route(path + "/stats", stats, methods=["GET"]) for path in ("/v2/models", _MODEL, _VERSION)
    ]


def extension_routes(core: CoreAPI, max_body_size: int) -> list[Route]:
    """The repository, shared-memory, logging and trace-setting routes."""
    return [
        *_repository_routes(core, max_body_size),
        *_system_shm_routes(core, max_body_size),
        *_cuda_shm_routes(core, max_body_size),
        *_logging_routes(core, max_body_size),
        *_trace_routes(core, max_body_size),
    ]


def _extension(extension: str) -> Callable[[Endpoint], Endpoint]:
    """Answer 501 when the core raises ``NotImplementedError`` (an ``AttributeError`` is a bug
    and stays a 500)."""
    message = f"{extension} is not supported by this server"

    def wrap(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def supported(request: Request) -> Response:
            try:
                return await endpoint(request)
            except NotImplementedError:
                raise Unsupported(message) from None

        return guarded(supported)

    return wrap


async def _body(request: Request, limit: int) -> bytes | bytearray:
    return await read_body(request.receive, request.headers.get("content-length"), limit)


def _empty() -> Response:
    """Success without a body (load, unload, register, unregister), as Triton answers."""
    return Response(status_code=200)


# --- statistics -------------------------------------------------------------------------------


def _model_stats(core: CoreAPI) -> Endpoint:
    async def model_stats(request: Request) -> Response:
        if "model_name" in request.path_params:
            name, version = model_ref(request.path_params)
        else:
            name, version = "", ""
        return json_response(codec.model_stats_json(core.model_statistics(name, version)))

    return model_stats


# --- model repository -------------------------------------------------------------------------


def _repository_routes(core: CoreAPI, limit: int) -> list[Route]:
    supported = _extension("model repository")

    async def index(request: Request) -> Response:
        ready_only = codec.parse_index_request(await _body(request, limit))
        return json_response(codec.repository_index_json(core.repository_index(ready_only)))

    async def load(request: Request) -> Response:
        parsed = codec.parse_load_request(await _body(request, limit))
        await core.load_model(request.path_params["model_name"], parsed.config_json, parsed.files)
        return _empty()

    async def unload(request: Request) -> Response:
        unload_dependents = codec.parse_unload_request(await _body(request, limit))
        await core.unload_model(request.path_params["model_name"], unload_dependents)
        return _empty()

    async def named(request: Request) -> Response:
        # Triton's route takes a repository name and refuses it, before reading the body.
        raise Unsupported("'repository_name' specification is not supported")

    model = _REPOSITORY + "/models/{model_name}"
    named_model = _REPOSITORY + "/{repository_name}/models/{model_name}"
    return [
        Route(_REPOSITORY + "/index", supported(index), methods=["POST"]),
        Route(model + "/load", supported(load), methods=["POST"]),
        Route(model + "/unload", supported(unload), methods=["POST"]),
        Route(_REPOSITORY + "/{repository_name}/index", guarded(named), methods=["POST"]),
        Route(named_model + "/load", guarded(named), methods=["POST"]),
        Route(named_model + "/unload", guarded(named), methods=["POST"]),
    ]


# --- shared memory ----------------------------------------------------------------------------


def _system_shm_routes(core: CoreAPI, limit: int) -> list[Route]:
    supported = _extension("system shared memory")

    async def status(request: Request) -> Response:
        return json_response(codec.shm_status_json(core.system_shm_status(_region(request))))

    async def register(request: Request) -> Response:
        name = _region_to_register(request, "system")
        parsed = codec.parse_register_request(await _body(request, limit))
        core.register_system_shm(name, parsed.key, parsed.offset, parsed.byte_size)
        return _empty()

    async def unregister(request: Request) -> Response:
        core.unregister_system_shm(_region(request))
        return _empty()

    return _shm_routes(_SYSTEM_SHM, supported(status), supported(register), supported(unregister))


def _cuda_shm_routes(core: CoreAPI, limit: int) -> list[Route]:
    supported = _extension("CUDA shared memory")

    async def status(request: Request) -> Response:
        return json_response(cuda_shm_status_json(core.cuda_shm_status(_region(request))))

    async def register(request: Request) -> Response:
        name = _region_to_register(request, "cuda")
        parsed = parse_cuda_register_request(await _body(request, limit))
        core.register_cuda_shm(name, parsed.raw_handle, parsed.device_id, parsed.byte_size)
        return _empty()

    async def unregister(request: Request) -> Response:
        core.unregister_cuda_shm(_region(request))
        return _empty()

    return _shm_routes(_CUDA_SHM, supported(status), supported(register), supported(unregister))


def _region(request: Request) -> str:
    """The shared-memory region a request names ("" when none: every region)."""
    name: str = request.path_params.get("region_name", "")
    return name


def _region_to_register(request: Request, kind: str) -> str:
    name = _region(request)
    if not name:
        raise InvalidArgument(f"'region name' is necessary to register {kind} shared memory region")
    return name


def _shm_routes(
    prefix: str, status: Endpoint, register: Endpoint, unregister: Endpoint
) -> list[Route]:
    """Triton's paths: ``{prefix}[/region/{name}]/(status|register|unregister)``."""
    routes = []
    for path in (prefix, prefix + _REGION):
        routes += [
            Route(path + "/status", status, methods=["GET"]),
            Route(path + "/register", register, methods=["POST"]),
            Route(path + "/unregister", unregister, methods=["POST"]),
        ]
    return routes


# --- logging ----------------------------------------------------------------------------------


def _logging_routes(core: CoreAPI, limit: int) -> list[Route]:
    async def settings(request: Request) -> Response:
        if request.method == "GET":
            return json_response(core.log_settings())
        changes = codec.parse_log_settings(await _body(request, limit))
        return json_response(core.update_log_settings(changes))

    endpoint = _extension("logging")(settings)
    return [Route("/v2/logging", endpoint, methods=["GET", "POST"])]


# --- tracing ----------------------------------------------------------------------------------


def _trace_routes(core: CoreAPI, limit: int) -> list[Route]:
    async def settings(request: Request) -> Response:
        model = request.path_params.get("model_name", "")
        if request.method == "GET":
            return json_response(core.trace_settings(model))
        changes = parse_trace_settings(await _body(request, limit))
        return json_response(core.update_trace_settings(changes, model))

    endpoint = _extension("trace")(settings)
    return [
        Route(path + "/trace/setting", endpoint, methods=["GET", "POST"])
        for path in ("/v2", _MODEL)
    ]
