"""Composition: wire the service and the frontends, run until asked to stop, shut down in order."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from shoal import _compiled
from shoal.supervisor.compose import build_service
from shoal.supervisor.memory.gc_tuning import settle_after_start
from shoal.supervisor.options import Restriction, ServerOptions
from shoal.supervisor.service import InferenceService

if TYPE_CHECKING:
    from shoal.frontends.grpc.aio import GrpcServer
    from shoal.frontends.grpc.native import NativeGrpcServer
    from shoal.frontends.http.app import HttpServer

log = logging.getLogger("shoal")


def _report_hot_path() -> None:
    if _compiled.state == "stale":
        log.warning(
            "the compiled hot path is older than its sources, so it runs interpreted (slower); "
            "rebuild it with `make` or `pip install --no-build-isolation -e .`"
        )
    else:
        log.info("request hot path: %s", _compiled.state)


def announce(protocol: str, host: str, port: int) -> None:
    """One machine-readable line per bound endpoint, for scripts and tests."""
    print(f"SHOAL_LISTENING {protocol} {host} {port}", flush=True)


async def _start_metrics(service: InferenceService, options: ServerOptions) -> HttpServer:
    """Serve ``/metrics`` on its own port; the values are computed from ``service`` per scrape."""
    from shoal.frontends.http.app import AddressInUseError, HttpServer
    from shoal.frontends.http.metrics import build_metrics_app
    from shoal.supervisor.extensions.metrics import MetricsExporter

    exporter = MetricsExporter(
        service,
        interval_ms=options.metrics_interval_ms,
        cpu_metrics=options.allow_cpu_metrics,
    )
    server = HttpServer(build_metrics_app(exporter.render))
    host, port = options.metrics_address, options.metrics_port
    try:
        bound = await server.start(host, port)
    except AddressInUseError as exc:
        raise AddressInUseError(
            exc.errno, f"the metrics address {host}:{port} is already in use"
        ) from exc
    announce("metrics", host, bound)
    return server


def _by_api(restrictions: tuple[Restriction, ...]) -> dict[str, tuple[str, str]]:
    """API group -> (key, value), as the frontends take restrictions."""
    return {api: (r.key, r.value) for r in restrictions for api in r.apis}


async def _start_grpc(
    service: InferenceService, options: ServerOptions
) -> GrpcServer | NativeGrpcServer:
    """Serve ``inference.GRPCInferenceService`` on the gRPC address."""
    from shoal.frontends.grpc.aio import GrpcServer
    from shoal.frontends.grpc.native import FloodLimits, NativeGrpcServer

    restricted = _by_api(options.grpc_restricted_protocol)
    limits = FloodLimits(
        max_ping_strikes=options.grpc_http2_max_ping_strikes,
        min_ping_interval=options.grpc_http2_min_recv_ping_interval_without_data / 1000,
        permit_pings_without_calls=options.grpc_keepalive_permit_without_calls,
        max_queued_replies=options.grpc_http2_max_queued_control_frames,
        reset_burst=options.grpc_http2_stream_reset_burst,
        reset_rate=options.grpc_http2_stream_reset_rate,
        max_empty_frames=options.grpc_http2_max_empty_frames,
        read_timeout=options.grpc_read_timeout_secs,
    )
    size = options.grpc_max_message_size
    server: GrpcServer | NativeGrpcServer
    if options.grpc_server == "grpcio":
        server = GrpcServer(service, max_message_bytes=size, restricted=restricted, limits=limits)
    else:
        server = NativeGrpcServer(
            service, max_message_bytes=size, restricted=restricted, limits=limits
        )
    port = await server.start(options.grpc_address, options.grpc_port)
    announce("grpc", options.grpc_address, port)
    return server


async def _drain(service: InferenceService, timeout: float) -> float:
    """Refuse new inference (503) and report not ready while the requests in flight finish, with
    the endpoints still open: a load balancer retries the refused requests on another replica
    and its health checks see this one leave. Returns the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    service.begin_drain()
    if service.gate.in_flight:
        log.info("draining %d in-flight inference requests", service.gate.in_flight)
    if not await service.gate.drained(timeout):
        log.warning(
            "%d inference requests were still running at the exit timeout", service.gate.in_flight
        )
    return loop.time() - started


async def run_server(options: ServerOptions, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set. Shutdown order: frontends, then models, then arenas."""
    from shoal.frontends.http.app import ConnectionLimits, HttpServer, build_http_app

    service = build_service(options)
    http: HttpServer | None = None
    metrics: HttpServer | None = None
    grpc_server: GrpcServer | NativeGrpcServer | None = None
    grace = options.exit_timeout_secs  # what the frontends get to finish, after the drain
    try:
        await service.load_repository()
        if options.exit_on_error and service.failed:
            log.error("exiting: some models failed to load (--exit-on-error=true)")
            return 1
        if options.allow_http:
            app = build_http_app(
                service,
                max_input_size=options.http_max_input_size,
                restricted=_by_api(options.http_restricted_api),
            )
            limits = ConnectionLimits(
                max_header_size=options.http_max_header_size,
                header_timeout=options.http_header_timeout_secs,
                body_timeout=options.http_body_timeout_secs,
            )
            http = HttpServer(app, limits=limits)
            port = await http.start(options.http_address, options.http_port)
            announce("http", options.http_address, port)
        if options.allow_grpc:
            grpc_server = await _start_grpc(service, options)
        if options.allow_metrics:
            metrics = await _start_metrics(service, options)
        _report_hot_path()
        settle_after_start()
        log.info("shoal is ready")
        await stop.wait()
        log.info("shutting down (exit timeout %.0fs)", options.exit_timeout_secs)
        grace -= await _drain(service, options.exit_timeout_secs)
        return 0
    finally:
        # gRPC drains (up to the exit timeout) while HTTP does.
        grpc_stopping = (
            None
            if grpc_server is None
            else asyncio.ensure_future(grpc_server.stop(grace=max(1.0, grace)))
        )
        if http is not None:
            try:
                await asyncio.wait_for(http.stop(), max(1.0, grace))
            except asyncio.TimeoutError:
                log.warning("in-flight HTTP requests did not finish within the exit timeout")
        if metrics is not None:
            try:
                await asyncio.wait_for(metrics.stop(), options.exit_timeout_secs)
            except asyncio.TimeoutError:
                log.warning("the metrics endpoint did not stop within the exit timeout")
        if grpc_stopping is not None:
            await grpc_stopping
        await service.shutdown(timeout=max(1.0, options.exit_timeout_secs))
        sys.stdout.flush()
