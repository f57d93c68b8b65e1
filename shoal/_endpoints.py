"""The endpoints over a core: HTTP, gRPC (native or grpcio) and metrics, each started with the
limits and restrictions of the server's options, and announced once bound."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from shoal.supervisor.options import Restriction, ServerOptions
from shoal.supervisor.service import InferenceService

if TYPE_CHECKING:
    from shoal.core.api import CoreAPI
    from shoal.frontends.grpc.aio import GrpcServer
    from shoal.frontends.grpc.native import FloodLimits, NativeGrpcServer
    from shoal.frontends.http.app import HttpServer
    from shoal.frontends.workers.arenas import StagingArena
    from shoal.frontends.workers.dealing import ProtocolFactory


def announce(protocol: str, host: str, port: int) -> None:
    """One machine-readable line per bound endpoint, for scripts and tests."""
    print(f"SHOAL_LISTENING {protocol} {host} {port}", flush=True)


async def start_metrics(service: InferenceService, options: ServerOptions) -> HttpServer:
    """Serve ``/metrics`` on its own port; the values are computed from ``service`` per scrape."""
    from shoal.frontends._serving import address_in_use
    from shoal.frontends.http.app import AddressInUseError, HttpServer
    from shoal.frontends.http.metrics import build_metrics_app
    from shoal.supervisor.extensions.metrics import MetricsExporter

    exporter = MetricsExporter(
        service,
        interval_ms=options.metrics_interval_ms,
        cpu_metrics=options.allow_cpu_metrics,
        counter_latencies=options.counter_latencies,
    )
    server = HttpServer(build_metrics_app(exporter.render))
    host, port = options.metrics_address, options.metrics_port
    try:
        bound = await server.start(host, port)
    except AddressInUseError as exc:
        raise address_in_use("metrics", host, port) from exc
    announce("metrics", host, bound)
    return server


def _by_api(restrictions: tuple[Restriction, ...]) -> dict[str, tuple[str, str]]:
    """API group -> (key, value), as the frontends take restrictions."""
    return {api: (r.key, r.value) for r in restrictions for api in r.apis}


async def _start_grpc(core: CoreAPI, options: ServerOptions) -> GrpcServer | NativeGrpcServer:
    """The server of ``inference.GRPCInferenceService`` the options choose, not started."""
    from shoal.frontends._forwarding import header_forward
    from shoal.frontends.grpc.aio import GrpcServer
    from shoal.frontends.grpc.native import NativeGrpcServer

    restricted = _by_api(options.grpc_restricted_protocol)
    limits = _flood_limits(options)
    forward = header_forward(options.grpc_header_forward_pattern)
    level = options.grpc_infer_response_compression_level
    size = options.grpc_max_message_size
    if options.grpc_server == "grpcio":
        # grpcio binds its own sockets: workers share the port with SO_REUSEPORT.
        aio = GrpcServer(
            core,
            max_message_bytes=size,
            restricted=restricted,
            limits=limits,
            reuse_port=options.frontend_workers > 1 or options.reuse_grpc_port,
            forward=forward,
            compression_level=level,
        )
        return aio
    return NativeGrpcServer(
        core,
        max_message_bytes=size,
        restricted=restricted,
        limits=limits,
        max_connection_bytes=options.grpc_max_connection_buffer_size,
        receive_into=_staging_arena(core),
        forward=forward,
        compression_level=level,
    )


def _staging_arena(core: CoreAPI) -> StagingArena | None:
    """A frontend worker's input arena, which large gRPC inputs are received into."""
    from shoal.frontends.workers.client import RemoteCore

    return core.arena if isinstance(core, RemoteCore) else None


def _flood_limits(options: ServerOptions) -> FloodLimits:
    """The HTTP/2 flood limits of the gRPC flags (docs/hardening.md)."""
    from shoal.frontends.grpc.native import FloodLimits

    return FloodLimits(
        max_ping_strikes=options.grpc_http2_max_ping_strikes,
        min_ping_interval=options.grpc_http2_min_recv_ping_interval_without_data / 1000,
        permit_pings_without_calls=options.grpc_keepalive_permit_without_calls,
        max_queued_replies=options.grpc_http2_max_queued_control_frames,
        reset_burst=options.grpc_http2_stream_reset_burst,
        reset_rate=options.grpc_http2_stream_reset_rate,
        max_empty_frames=options.grpc_http2_max_empty_frames,
        read_timeout=options.grpc_read_timeout_secs,
        send_timeout=options.grpc_send_timeout_secs,
        max_send_buffer=options.grpc_max_connection_send_buffer_size,
        keepalive_time=options.grpc_keepalive_time / 1000,
        keepalive_timeout=options.grpc_keepalive_timeout / 1000,
        max_pings_without_data=options.grpc_http2_max_pings_without_data,
        max_age=options.grpc_max_connection_age / 1000,
        max_age_grace=options.grpc_max_connection_age_grace / 1000,
    )


async def start_frontends(
    core: CoreAPI, options: ServerOptions
) -> tuple[HttpServer | None, GrpcServer | NativeGrpcServer | None]:
    """Start HTTP and gRPC over ``core`` in the core process (N = 1), on the ports they bind."""
    http: HttpServer | None = None
    try:
        if options.allow_http:
            http = _http_server(core, options)
            host, port = options.http_address, options.http_port
            port = await http.start(host, port, _bound(host, port, "HTTP", options.reuse_http_port))
            announce("http", host, port)
        grpc_server = None
        if options.allow_grpc:
            grpc_server = await _start_grpc_endpoint(core, options)
    except BaseException:
        if http is not None:
            await http.stop()
        raise
    return http, grpc_server


async def start_worker_frontends(
    core: CoreAPI, options: ServerOptions
) -> tuple[HttpServer | None, GrpcServer | NativeGrpcServer | None, dict[bytes, ProtocolFactory]]:
    """Start HTTP and gRPC over ``core`` in a frontend worker, with no listener of their own: the
    core accepts and deals the connections, served by the returned factories (by the protocol's
    byte of ``workers/dealing.py``). grpcio binds its own sockets: its workers share the port
    with ``SO_REUSEPORT`` instead. A worker announces no port: the core does."""
    from shoal.frontends.grpc.native import NativeGrpcServer
    from shoal.frontends.workers.dealing import GRPC, HTTP

    factories: dict[bytes, ProtocolFactory] = {}
    http: HttpServer | None = None
    try:
        if options.allow_http:
            http = _http_server(core, options)
            await http.start_unbound()
            factories[HTTP] = http.connection_factory()
        grpc_server = None
        if options.allow_grpc:
            grpc_server = await _start_grpc(core, options)
            if isinstance(grpc_server, NativeGrpcServer):
                factories[GRPC] = grpc_server.start_unbound()
            else:
                await grpc_server.start(options.grpc_address, options.grpc_port)
    except BaseException:
        if http is not None:
            await http.stop()
        raise
    return http, grpc_server, factories


def _http_server(core: CoreAPI, options: ServerOptions) -> HttpServer:
    from shoal.frontends._forwarding import header_forward
    from shoal.frontends.http.app import ConnectionLimits, HttpServer, build_http_app

    app = build_http_app(
        core,
        max_input_size=options.http_max_input_size,
        restricted=_by_api(options.http_restricted_api),
        forward=header_forward(options.http_header_forward_pattern),
    )
    limits = ConnectionLimits(
        max_header_size=options.http_max_header_size,
        header_timeout=options.http_header_timeout_secs,
        body_timeout=options.http_body_timeout_secs,
        send_timeout=options.http_send_timeout_secs,
    )
    return HttpServer(app, limits=limits)


async def _start_grpc_endpoint(
    core: CoreAPI, options: ServerOptions
) -> GrpcServer | NativeGrpcServer:
    from shoal.frontends.grpc.native import NativeGrpcServer

    grpc_server = await _start_grpc(core, options)
    host, port = options.grpc_address, options.grpc_port
    if isinstance(grpc_server, NativeGrpcServer):
        port = await grpc_server.start(
            host, port, _bound(host, port, "gRPC", options.reuse_grpc_port)
        )
    else:
        port = await grpc_server.start(host, port)
    announce("grpc", host, port)
    return grpc_server


def _bound(host: str, port: int, what: str, reuse_port: bool) -> socket.socket | None:
    """The socket to serve with ``--reuse-*-port``; None: the server binds its own."""
    if not reuse_port:
        return None
    from shoal.frontends._serving import bind_socket

    return bind_socket(host, port, what=what, reuse_port=True)
