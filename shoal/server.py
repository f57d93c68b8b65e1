"""Composition: wire the service and the frontends, run until asked to stop, shut down in order."""

from __future__ import annotations

import asyncio
import logging
import sys

from shoal.supervisor.options import ServerOptions
from shoal.supervisor.service import InferenceService

log = logging.getLogger("shoal")


def announce(protocol: str, host: str, port: int) -> None:
    """One machine-readable line per bound endpoint, for scripts and tests."""
    print(f"SHOAL_LISTENING {protocol} {host} {port}", flush=True)


async def run_server(options: ServerOptions, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set. Shutdown order: frontends, then models, then arenas."""
    from shoal.frontends.http import HttpServer, build_http_app

    service = InferenceService(options)
    http: HttpServer | None = None
    try:
        await service.load_repository()
        if options.exit_on_error and service.failed:
            log.error("exiting: some models failed to load (--exit-on-error=true)")
            return 1
        if options.allow_http:
            app = build_http_app(service, max_input_size=options.http_max_input_size)
            http = HttpServer(app)
            port = await http.start(options.http_address, options.http_port)
            announce("http", options.http_address, port)
        if options.allow_grpc:
            log.warning(
                "the gRPC endpoint is not implemented yet: --grpc-port %d is not bound",
                options.grpc_port,
            )
        if options.allow_metrics:
            log.warning(
                "the metrics endpoint is not implemented yet: --metrics-port %d is not bound",
                options.metrics_port,
            )
        log.info("shoal is ready")
        await stop.wait()
        log.info("shutting down (exit timeout %.0fs)", options.exit_timeout_secs)
        return 0
    finally:
        if http is not None:
            try:
                await asyncio.wait_for(http.stop(), options.exit_timeout_secs)
            except asyncio.TimeoutError:
                log.warning("in-flight HTTP requests did not finish within the exit timeout")
        await service.shutdown(timeout=max(1.0, options.exit_timeout_secs))
        sys.stdout.flush()
