"""Composition: wire the service and the frontends, run until asked to stop, shut down in order."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from shoal import _compiled
from shoal.supervisor.compose import build_service
from shoal.supervisor.memory.gc_tuning import settle_after_start
from shoal.supervisor.models.table import format_model_table
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


#: What a frontend gets to close its sockets when requests still run at the end of the drain.
_CLOSE_SECS = 0.2
#: The end of the exit timeout kept for the models' finalize (at most half of it): a request
#: that never finishes must not leave the idle models no time to finalize.
_FINALIZE_RESERVE = 1.0


async def _drain(service: InferenceService, timeout: float) -> bool:
    """Refuse new inference (503) and report not ready while the requests in flight finish, with
    the endpoints still open: a load balancer retries the refused requests on another replica
    and its health checks see this one leave. False if some still run after ``timeout``."""
    service.begin_drain()
    if service.gate.in_flight:
        log.info("draining %d in-flight inference requests", service.gate.in_flight)
    if not await service.gate.drained(timeout):
        log.warning(
            "%d inference requests were still running at the exit timeout", service.gate.in_flight
        )
        return False
    return True


async def run_server(options: ServerOptions, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set. Shutdown order: frontends, then models, then arenas."""
    from shoal.frontends.http.app import ConnectionLimits, HttpServer, build_http_app

    service = build_service(options)
    http: HttpServer | None = None
    metrics: HttpServer | None = None
    grpc_server: GrpcServer | NativeGrpcServer | None = None
    loop = asyncio.get_running_loop()
    #: When the shutdown must be over: ``--exit-timeout-secs`` is the total for the drain, the
    #: frontends and the models together, as in Triton (set when the shutdown starts).
    deadline: float | None = None
    drained = False
    try:
        failures = await service.load_repository()
        log.info("models:\n%s", format_model_table(service.repository_index()))
        if options.exit_on_error and failures:
            log.error(
                "exiting: %d model(s) failed to load: %s (--exit-on-error=true; start with "
                "--exit-on-error=false to serve the others)",
                len(failures),
                ", ".join(sorted(failures)),
            )
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
        timeout = options.exit_timeout_secs
        deadline = loop.time() + timeout
        log.info("shutting down (exit timeout %.0fs)", timeout)
        drained = await _drain(service, timeout - min(_FINALIZE_RESERVE, timeout / 2))
        return 0
    finally:
        if deadline is None:  # a failed start: the same budget for what was started
            deadline = loop.time() + options.exit_timeout_secs

        def left() -> float:
            return max(0.0, deadline - loop.time())

        # Once drained, the frontends get until the deadline to write the last responses; if
        # requests still run, they only close their sockets: those requests would not finish.
        grace = min(left(), _CLOSE_SECS) if not drained else max(left(), _CLOSE_SECS)
        # gRPC drains while HTTP does.
        grpc_stopping = (
            None if grpc_server is None else asyncio.ensure_future(grpc_server.stop(grace=grace))
        )
        if http is not None:
            try:
                await asyncio.wait_for(http.stop(), grace)
            except asyncio.TimeoutError:
                log.warning("in-flight HTTP requests did not finish within the exit timeout")
        if metrics is not None:
            try:
                await asyncio.wait_for(metrics.stop(), grace)
            except asyncio.TimeoutError:
                log.warning("the metrics endpoint did not stop within the exit timeout")
        if grpc_stopping is not None:
            await grpc_stopping
        # What is left goes to the models' finalize; a stub still running then is killed.
        await service.shutdown(timeout=left())
        sys.stdout.flush()
