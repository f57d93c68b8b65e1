"""The HTTP/REST frontend: KServe V2 endpoints, compatible with Triton and ``tritonclient.http``.

:func:`build_http_app` builds a Starlette app over a :class:`~shoal.core.api.CoreAPI`; it
only parses, calls the core and renders (see :mod:`shoal.frontends.http.codec`). :class:`HttpServer`
serves an app with uvicorn on the supervisor's running event loop. Core errors become
``{"error": "<message>"}`` with the HTTP status of :data:`HTTP_STATUS`, the one table that maps
error codes to statuses.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable, Mapping
from typing import Any, cast

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from shoal.core import CoreAPI, InferResponse, ShoalError
from shoal.core.versions import check_version
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends._limits import ConnectionLimits
from shoal.frontends._restricted import Restrictions, restrict_routes
from shoal.frontends._serving import AddressInUseError, EmbeddedServer, bind_socket, wait_started
from shoal.frontends.http import _json, codec
from shoal.frontends.http._body import ClientDisconnected, read_body
from shoal.frontends.http._endpoint import (
    HTTP_STATUS,
    JSON_TYPE,
    Endpoint,
    Headers,
    error_parts,
    guarded,
    http_exception,
    infer_error_parts,
    json_response,
    model_ref,
    unexpected,
)
from shoal.frontends.http._fast_request import FastRequest
from shoal.frontends.http._header_names import RAW_HEADERS, protocol_class
from shoal.frontends.http._slow_ways import (
    THREAD_THRESHOLD,
    compressed,
    decoded_slowly,
    encoded_in_thread,
)
from shoal.frontends.http.extensions import extension_routes, model_stats_routes
from shoal.frontends.http.generate import generate_routes
from shoal.frontends.http.routing import InferRoutes

__all__ = ["HTTP_STATUS", "AddressInUseError", "ConnectionLimits", "HttpServer", "build_http_app"]


def build_http_app(
    core: CoreAPI,
    *,
    max_input_size: int = codec.DEFAULT_MAX_INPUT_SIZE,
    restricted: Mapping[str, tuple[str, str]] | None = None,
    forward: HeaderForward | None = None,
) -> Starlette:
    """The KServe V2 REST app; infer bodies over ``max_input_size`` bytes are refused unread.

    ``restricted`` maps an API group (see :mod:`shoal.frontends._restricted`) to the header and
    value its requests must carry (``--http-restricted-api``); other requests get 403.
    ``forward`` (``--http-header-forward-pattern``): the headers an inference request's
    parameters get; the fast path keeps only the headers it reads, so it is off then.
    """
    infer = _InferEndpoint(core, max_input_size, forward)
    routes = _server_routes(core) + _model_routes(core) + infer.routes.routes
    routes += generate_routes(core, max_input_size)
    routes += extension_routes(core, max_input_size)
    restrictions = Restrictions(restricted or {})
    return _App(
        infer=None if restricted or forward else infer,
        forwards_headers=forward is not None,
        routes=restrict_routes(routes, restrictions),
        exception_handlers={HTTPException: http_exception},
    )


def _server_routes(core: CoreAPI) -> list[BaseRoute]:
    """Health and server metadata, and the statistics of every model."""
    return [
        Route("/v2/health/live", _health("live", core.is_live), methods=["GET"]),
        Route("/v2/health/ready", _health("ready", core.is_ready), methods=["GET"]),
        Route("/v2", _server_metadata(core), methods=["GET"]),
        # Before "/v2/models/{model_name}", which would take "stats" for a model name.
        *model_stats_routes(core),
    ]


def _model_routes(core: CoreAPI) -> list[BaseRoute]:
    """A model's metadata, readiness and configuration, with and without a version."""
    routes: list[BaseRoute] = []
    for model in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        routes += [
            Route(model, _model_metadata(core), methods=["GET"]),
            Route(model + "/ready", _model_ready(core), methods=["GET"]),
            Route(model + "/config", _model_config(core), methods=["GET"]),
        ]
    return routes


class _App(Starlette):
    """The REST app, with a fast path for inference: it skips Starlette's middleware and the
    scan of every route (tens of microseconds a request) when no API is restricted."""

    def __init__(
        self, *, infer: _InferEndpoint | None, forwards_headers: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._infer = infer
        #: Served by the HTTP protocol without ASGI (see :mod:`.fast_path`).
        self.fast_infer = infer
        #: Header names are kept as sent (:mod:`._header_names`).
        self.forwards_headers = forwards_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._infer is not None and scope["type"] == "http" and scope["method"] == "POST":
            params = self._infer.routes.match_path(scope["path"])
            if params is not None:
                scope["path_params"] = params
                scope["app"] = self
                await self._infer(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


# --- health and metadata ----------------------------------------------------------------------


def _health(key: str, check: Callable[[], bool]) -> Endpoint:
    @guarded
    async def health(request: Request) -> Response:
        # The status as Triton's (400, not 503, when not live / not ready), which is all that
        # tritonclient reads; the body as the KServe V2 spec's ({"live": true}), which the
        # KServe SDK reads.
        state = check()
        return Response(_json.dumps({key: state}), 200 if state else 400, media_type=JSON_TYPE)

    return health


def _server_metadata(core: CoreAPI) -> Endpoint:
    @guarded
    async def server_metadata(request: Request) -> Response:
        return json_response(codec.server_metadata_json(core.server_metadata()))

    return server_metadata


def _model_metadata(core: CoreAPI) -> Endpoint:
    @guarded
    async def model_metadata(request: Request) -> Response:
        name, version = model_ref(request.path_params)
        return json_response(codec.model_metadata_json(core.model_metadata(name, version)))

    return model_metadata


def _model_ready(core: CoreAPI) -> Endpoint:
    @guarded
    async def model_ready(request: Request) -> Response:
        name, version = model_ref(request.path_params)
        if await core.model_ready_now(name, version):
            return Response(status_code=200)
        body = _json.dumps({"error": "Model version not ready"})
        return Response(body, 400, media_type=JSON_TYPE)

    return model_ready


def _model_config(core: CoreAPI) -> Endpoint:
    @guarded
    async def model_config(request: Request) -> Response:
        name, version = model_ref(request.path_params)
        return json_response(core.model_config(name, version))

    return model_config


# --- inference --------------------------------------------------------------------------------


class _InferEndpoint:
    """``POST .../infer`` as a bare ASGI app (Starlette's Route serves it without wrapping), and
    as :meth:`respond` for the HTTP protocol's fast path (:mod:`.fast_path`).

    It reads the body itself, to refuse an oversized one before reading it and to copy it once, and
    sends one pre-built body: no Request or Response objects on the hot path.
    """

    def __init__(
        self, core: CoreAPI, max_input_size: int, forward: HeaderForward | None = None
    ) -> None:
        self._core = core
        #: Looked up once: what a raw binary request's input is deduced from.
        self._config_of = core.model_config
        self.limit = max_input_size
        #: Where the fast path hands its timestamps of a traced request.
        self.frontend_trace = core.frontend_trace
        self._forward = forward
        #: The URL it serves (:mod:`.routing`): the app's routes and the fast ways' matchers.
        self.routes = InferRoutes(self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        params = scope["path_params"]
        what = "Request JSON" if headers.get(codec.HEADER_LENGTH) is None else "Request"
        try:
            body = await read_body(receive, headers.get("content-length"), self.limit, what=what)
        except ClientDisconnected:
            return  # nobody is left to answer
        except ShoalError as exc:
            await _send(send, *error_parts(exc))
            return
        name, version = params["model_name"], params.get("model_version", "")
        forwarded = None
        if self._forward is not None:  # the names as sent, where the protocol kept them
            lines = scope.get(RAW_HEADERS, scope["headers"])
            forwarded = [(k.decode("latin-1"), v) for k, v in lines]
        await _send(send, *await self.respond(name, version, headers, body, False, forwarded))

    async def respond(
        self,
        name: str,
        version: str,
        headers: dict[str, str],
        body: bytes | bytearray | memoryview,
        lend: bool = False,
        forwarded: list[tuple[str, bytes]] | None = None,
        front: FastRequest | None = None,
    ) -> tuple[int, Headers, codec.Body]:
        """Status, headers and body of the answer to an inference request; with ``lend``, a
        large binary body may be a :class:`codec.LentBody` (the caller releases it).
        ``forwarded``: the header lines a forward pattern reads (the ASGI way's). ``front``:
        the fast path's request: its ``trace_id`` is set where the core traces it.

        One coroutine for the usual request (a small body, no compression): each level of
        ``await`` costs every request on its way in and again when it resumes; the slower
        ways are coroutines of their own, awaited only where they apply."""
        request_id = ""
        try:
            check_version(version)
            encoding = codec.request_encoding(headers.get("content-encoding"))
            header_length = headers.get(codec.HEADER_LENGTH)
            if encoding is None and (header_length is not None or len(body) < THREAD_THRESHOLD):
                decoded = codec.decode_infer_request(
                    body,
                    model_name=name,
                    model_version=version,
                    header_length=header_length,
                    config_of=self._config_of,
                )
            else:
                decoded = await decoded_slowly(
                    name, version, body, encoding, header_length, self.limit, self._config_of
                )
            if self._forward is not None:
                lines = headers.items() if forwarded is None else forwarded
                decoded.request.parameters.update(self._forward.matching(lines))
            request = decoded.request
            request_id = request.id
            if front is not None:
                request.trace_id = -1  # the frontend hands its timestamps (trace_files.py)
            try:
                response = await self._core.infer(request)
            finally:
                if front is not None and request.trace_id > 0:
                    front.trace_id = request.trace_id
            accept = codec.response_encoding(headers.get("accept-encoding"))
            if codec.json_output_bytes(response, decoded.output_format) < THREAD_THRESHOLD:
                out_headers, out = _encoded(response, decoded, lend and accept is None)
            else:
                out_headers, out = await encoded_in_thread(response, decoded)
            if accept is not None:
                out_headers, out = await compressed(out_headers, out, accept)
            return 200, out_headers, out
        except ShoalError as exc:
            return infer_error_parts(request_id, exc)
        except Exception:
            return infer_error_parts(request_id, unexpected("an inference request"))


def _encoded(
    response: InferResponse, decoded: codec.DecodedRequest, lend: bool = False
) -> tuple[Headers, codec.Body]:
    """Headers and body of a response; the response is released, the body being a copy (the
    shared memory goes back before sending), unless ``lend`` and the body is lent (the caller
    releases it once sent: :class:`codec.LentBody`)."""
    lent = False
    try:
        encoded = codec.encode_infer_response(response, decoded.output_format)
        lent = lend and encoded.lendable()
        body = codec.LentBody(encoded.chunks, response.release) if lent else encoded.payload()
        headers = encoded.headers
    finally:
        if not lent:
            response.release()
    # Not returned from inside the try: compiled (mypyc 2.4.1), that let go of the encoded
    # response before referring to its headers, freeing a fresh tuple (a JSON response's).
    return headers, body


async def _send(send: Send, status: int, headers: Headers, body: codec.Body) -> None:
    raw_headers = [(b"content-length", str(codec.body_length(body)).encode("latin-1"))]
    raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    if isinstance(body, codec.LentBody):
        body = body.joined()  # not lent on this way: never here
    if isinstance(body, bytes):
        await send({"type": "http.response.body", "body": body})
        return
    for batch in codec.body_batches(body):  # the server's flow control paces each message
        await send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
    await send({"type": "http.response.body", "body": b""})


# --- serving ----------------------------------------------------------------------------------


class HttpServer:
    """Serves an ASGI app (normally :func:`build_http_app`'s) with uvicorn on the running loop.

    ``start`` binds and returns the bound port; ``stop`` stops accepting connections, lets
    in-flight requests finish (cancelling them after ``shutdown_timeout`` seconds) and returns.
    It installs no signal handlers: the CLI owns signals and calls :meth:`stop`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        keep_alive_timeout: int = 60,
        shutdown_timeout: int | None = 30,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._app = app
        self._limits = limits or ConnectionLimits()
        self._keep_alive_timeout = keep_alive_timeout
        self._shutdown_timeout = shutdown_timeout
        self._server: EmbeddedServer | None = None
        self._serving: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port; or serve ``sock``,
        a socket bound (and listening) already, as a frontend worker does.

        Raises :class:`AddressInUseError` if the address is taken.
        """
        if self._serving is not None:
            raise RuntimeError("the HTTP server is already running")
        if sock is None:
            sock = bind_socket(host, port)
        bound_port: int = sock.getsockname()[1]
        try:
            await self._run([sock])
        except BaseException:
            sock.close()
            raise
        return bound_port

    async def start_unbound(self) -> None:
        """Serve only the connections handed to :meth:`connection_factory`'s protocols: a
        frontend worker's, which the core accepts and deals (``workers/dealing.py``)."""
        if self._serving is not None:
            raise RuntimeError("the HTTP server is already running")
        await self._run([])

    async def _run(self, sockets: list[socket.socket]) -> None:
        server = EmbeddedServer(self._config())
        serving = asyncio.create_task(server.serve(sockets=sockets), name="shoal-http-server")
        try:
            await wait_started(server, serving)
        except BaseException:
            serving.cancel()
            raise
        self._server, self._serving = server, serving

    def connection_factory(self) -> Callable[[], asyncio.Protocol]:
        """What makes the protocol of one connection accepted elsewhere (``start_unbound``)."""
        server = self._server
        if server is None:
            raise RuntimeError("the HTTP server is not running")
        return functools.partial(
            protocol_class(self._app),  # what _config names
            config=server.config,
            server_state=server.server_state,
            app_state=server.lifespan.state,
        )

    async def stop(self) -> None:
        """Stop gracefully; a no-op when not running."""
        server, serving = self._server, self._serving
        if server is None or serving is None:
            return
        self._server = self._serving = None
        server.should_exit = True
        await serving

    def answer_last(self) -> None:
        """Each open connection closes after its next response: the core is gone, and a load
        balancer that reused one of them would only be answered 503 again, where a new
        connection is refused (the listening sockets are stopped) and takes the replica out."""
        server = self._server
        if server is None:
            return
        cast(_Config, server.config).last_responses = True
        for connection in list(server.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False

    def _config(self) -> uvicorn.Config:
        config = _Config(
            self._app,
            http=protocol_class(self._app),
            ws="none",
            lifespan="off",
            log_config=None,  # leave the process's logging configuration alone
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # no per-request header rewriting
            server_header=False,
            timeout_keep_alive=self._keep_alive_timeout,
            timeout_graceful_shutdown=self._shutdown_timeout,
        )
        config.connection_limits = self._limits
        return config


class _Config(uvicorn.Config):
    """uvicorn's configuration, with what :class:`FastInferHttpToolsProtocol` reads of shoal's
    own: the limits of a connection."""

    connection_limits = ConnectionLimits()
    #: Set by :meth:`HttpServer.answer_last`: every response from now on closes its connection.
    last_responses = False
