"""Composition: wire the service and the frontends, run until asked to stop, shut down in order."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
from typing import TYPE_CHECKING

import msgpack

from shoal import _compiled
from shoal._endpoints import announce, start_frontends, start_metrics, start_worker_frontends
from shoal.ipc import busy_poll
from shoal.supervisor.compose import build_service
from shoal.supervisor.extensions.log_settings import LOG_BLOCK
from shoal.supervisor.memory.gc_tuning import settle_after_start
from shoal.supervisor.models.table import format_model_table
from shoal.supervisor.options import ServerOptions
from shoal.supervisor.service import InferenceService

if TYPE_CHECKING:
    from shoal.frontends.grpc.aio import GrpcServer
    from shoal.frontends.grpc.native import NativeGrpcServer
    from shoal.frontends.http.app import HttpServer
    from shoal.frontends.workers.pool import WorkerPool

log = logging.getLogger("shoal")


def _report_hot_path() -> None:
    if _compiled.state == "stale":
        log.warning(
            "the compiled hot path is older than its sources, so it runs interpreted (slower); "
            "rebuild it with `make` or `pip install --no-build-isolation -e .`"
        )
    else:
        log.info("request hot path: %s", _compiled.state)


#: How long the drain waits for the frontend workers to stop sending requests to the stubs.
_ROUTES_STOP_SECS = 2.0
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
    started = asyncio.get_running_loop().time()
    if not await service.gate.drained(timeout):
        log.warning(
            "%d inference requests were still running at the exit timeout", service.gate.in_flight
        )
        return False
    left = max(0.0, timeout - (asyncio.get_running_loop().time() - started))
    if service.direct is not None and not await service.direct.drained(left):
        log.warning("requests sent straight to the stubs were still running at the exit timeout")
        return False
    return True


@dataclasses.dataclass
class _Running:
    """The servers started, stopped in this order at shutdown."""

    http: HttpServer | None = None
    metrics: HttpServer | None = None
    grpc: GrpcServer | NativeGrpcServer | None = None
    workers: WorkerPool | None = None

    async def stop(self, grace: float) -> None:
        # gRPC drains while HTTP does.
        grpc = self.grpc
        grpc_stopping = None if grpc is None else asyncio.ensure_future(grpc.stop(grace=grace))
        if self.workers is not None:
            await self.workers.stop(grace)
        await _stop_within(
            self.http, grace, "in-flight HTTP requests did not finish within the exit timeout"
        )
        await _stop_within(
            self.metrics, grace, "the metrics endpoint did not stop within the exit timeout"
        )
        if grpc_stopping is not None:
            await grpc_stopping


async def _stop_within(server: HttpServer | None, grace: float, late: str) -> None:
    if server is None:
        return
    try:
        await asyncio.wait_for(server.stop(), grace)
    except asyncio.TimeoutError:
        log.warning("%s", late)


async def run_server(options: ServerOptions, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set. Shutdown order: frontends, then models, then arenas."""
    service = build_service(options)
    running = _Running()
    loop = asyncio.get_running_loop()
    #: When the shutdown must be over: ``--exit-timeout-secs`` is the total for the drain, the
    #: frontends and the models together, as in Triton (set when the shutdown starts).
    deadline: float | None = None
    drained = False
    try:
        if not await _load(service, options):
            return 1
        options = _settle_busy_poll(options, service)
        await _start(service, options, running)
        _start_busy_poll(options, loop)
        await stop.wait()
        busy_poll.uninstall()  # the shutdown's sends need no answer soon
        timeout = options.exit_timeout_secs
        deadline = loop.time() + timeout
        service.begin_drain()
        if service.direct is not None:  # the workers send no request past the gate from now
            await service.direct.stopped(_ROUTES_STOP_SECS)
        log.info("shutting down (exit timeout %.0fs)", timeout)
        drained = await _drain(service, timeout - min(_FINALIZE_RESERVE, timeout / 2))
        return 0
    finally:
        busy_poll.uninstall()  # also after a failed start or a cancellation: it holds the loop
        if deadline is None:  # a failed start: the same budget for what was started
            deadline = loop.time() + options.exit_timeout_secs
        await _shut_down(service, running, deadline, drained)


def _settle_busy_poll(options: ServerOptions, service: InferenceService) -> ServerOptions:
    """``--busy-poll-us auto`` once the models are loaded: count the core, the workers and the
    stubs (the workers are told the outcome)."""
    if options.busy_poll_us >= 0:
        return options
    workers = options.frontend_workers if options.frontend_workers > 1 else 0
    stubs = sum(len(version.instances) for version in service.repository.versions())
    processes = 1 + workers + stubs
    budget = busy_poll.auto_budget_us(processes)
    if budget == 0 and busy_poll.auto_when_idle(processes):
        return dataclasses.replace(
            options, busy_poll_us=busy_poll.IDLE_SPIN_US, busy_poll_when_idle=True
        )
    return dataclasses.replace(options, busy_poll_us=budget)


def _start_busy_poll(options: ServerOptions, loop: asyncio.AbstractEventLoop) -> float:
    """Spin this process's loop after it sends work out (``--busy-poll-us``); the budget."""
    budget = max(0.0, options.busy_poll_us)
    busy_poll.install(loop, budget, options.busy_poll_when_idle)
    if budget:
        idle = " while cores are idle" if options.busy_poll_when_idle else ""
        log.info("busy poll: up to %.0f µs after sending work out%s", budget, idle)
    return budget


async def _load(service: InferenceService, options: ServerOptions) -> bool:
    """Load the repository; False when a model failed and ``--exit-on-error`` says to exit.
    A repository that cannot be read with ``--exit-on-error=false`` leaves the server up and
    not live, as Triton does (its health says so, its metadata still answers)."""
    try:
        failures = await service.load_repository()
    except FileNotFoundError as error:  # a --model-repository that is not a directory
        if options.exit_on_error:
            raise
        log.error("%s", error)
        service.live = False
        return True
    # The table's lines stay as they are (Triton's tables are not escaped): one record.
    log.info("models:", extra={LOG_BLOCK: format_model_table(service.repository_index())})
    if options.exit_on_error and failures:
        log.error(
            "exiting: %d model(s) failed to load: %s (--exit-on-error=true; start with "
            "--exit-on-error=false to serve the others)",
            len(failures),
            ", ".join(sorted(failures)),
        )
        return False
    return True


async def _start(service: InferenceService, options: ServerOptions, running: _Running) -> None:
    if options.frontend_workers > 1:
        running.workers = await _start_workers(service, options)
    else:
        running.http, running.grpc = await start_frontends(service, options)
    if options.allow_metrics:
        running.metrics = await start_metrics(service, options)
    _report_hot_path()
    settle_after_start()
    log.info("shoal is ready")


async def _shut_down(
    service: InferenceService, running: _Running, deadline: float, drained: bool
) -> None:
    loop = asyncio.get_running_loop()

    def left() -> float:
        return max(0.0, deadline - loop.time())

    # Once drained, the frontends get until the deadline to write the last responses; if
    # requests still run, they only close their sockets: those requests would not finish.
    grace = min(left(), _CLOSE_SECS) if not drained else max(left(), _CLOSE_SECS)
    await running.stop(grace)
    # What is left goes to the models' finalize; a stub still running then is killed.
    await service.shutdown(timeout=left())
    service.tracing.close()  # every request is over: the traces they left are written
    sys.stdout.flush()


# --- frontend workers (--frontend-workers N > 1) -------------------------------------------

#: What a frontend worker process runs (with its sockets' descriptors appended).
_WORKER_CODE = (
    "import sys; from shoal.server import worker_main; sys.exit(worker_main(sys.argv[1:]))"
)


def _listening(host: str, port: int, what: str, reuse_port: bool) -> socket.socket:
    from shoal.frontends._serving import bind_socket

    sock = bind_socket(host, port, what=what, reuse_port=reuse_port)
    sock.listen(2048)
    return sock


def _port_reservation(host: str, port: int) -> socket.socket:
    """A bound, not listening socket that holds a port for grpcio's SO_REUSEPORT listeners (a
    free port when ``port`` is 0)."""
    from shoal.frontends._serving import address_in_use

    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise address_in_use("gRPC", host, port) from exc
    return sock


async def _start_workers(service: InferenceService, options: ServerOptions) -> WorkerPool:
    """Bind the listening sockets here, once, and start the workers that serve what they
    accept (the core accepts and deals each connection to a worker: ``workers/dealing.py``)."""
    from shoal.frontends.workers import _plain as plain
    from shoal.frontends.workers.dealing import GRPC, HTTP
    from shoal.frontends.workers.pool import WorkerPool

    sockets: dict[str, socket.socket] = {}
    ports: dict[str, int] = {}
    try:
        if options.allow_http:
            sockets["http"] = _listening(
                options.http_address, options.http_port, "HTTP", options.reuse_http_port
            )
        if options.allow_grpc:
            if options.grpc_server == "grpcio":
                sockets["grpc-port"] = _port_reservation(options.grpc_address, options.grpc_port)
            else:
                sockets["grpc"] = _listening(
                    options.grpc_address, options.grpc_port, "gRPC", options.reuse_grpc_port
                )
        ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
        worker_options = dataclasses.replace(
            options,
            http_port=ports.get("http", options.http_port),
            grpc_port=ports.get("grpc", ports.get("grpc-port", options.grpc_port)),
        )
        kinds = ((HTTP, "http"), (GRPC, "grpc"))
        dealt = {kind: sockets[name] for kind, name in kinds if name in sockets}
        pool = WorkerPool(
            service,
            options.frontend_workers,
            [sys.executable, "-c", _WORKER_CODE],
            dealt,
            msgpack.packb(plain.to_plain(worker_options)),
            arenas=service.directory,
        )
        pool.sockets = [sock for name, sock in sockets.items() if name == "grpc-port"]
        await pool.start()
    except BaseException:
        for sock in sockets.values():
            sock.close()
        raise
    if "http" in ports:
        announce("http", options.http_address, ports["http"])
    if options.allow_grpc:
        announce("grpc", options.grpc_address, worker_options.grpc_port)
    log.info("%d frontend workers serve HTTP and gRPC", options.frontend_workers)
    return pool


def worker_main(argv: list[str]) -> int:
    """A frontend worker process: HTTP and gRPC over the core's API, on the connections the
    core deals it."""
    import argparse

    import uvloop

    parser = argparse.ArgumentParser(prog="shoal-frontend-worker")
    names = ("control", "calls", "segments", "arena", "parent", "index", "counters", "deal")
    for name in names:
        parser.add_argument(f"--{name}", type=int, default=-1)
    args = parser.parse_args(argv)
    from shoal.frontends.workers.process import follow_parent, read_hello

    follow_parent(args.parent)
    control = socket.socket(fileno=args.control)
    from shoal.frontends.workers._plain import from_plain

    options: ServerOptions = from_plain(ServerOptions, msgpack.unpackb(read_hello(control)))
    from shoal.supervisor.extensions.log_settings import configure_logging

    configure_logging(options)
    segments = socket.socket(fileno=args.segments) if args.segments >= 0 else None
    return int(
        uvloop.run(
            _serve_worker(
                options,
                control,
                socket.socket(fileno=args.calls),
                socket.socket(fileno=args.deal),
                segments,
                args.arena,
                args.index,
                args.counters,
            )
        )
    )


async def _serve_worker(
    options: ServerOptions,
    control: socket.socket,
    calls: socket.socket,
    deal: socket.socket,
    segments: socket.socket | None = None,
    arena_id: int = -1,
    index: int = 0,
    counters: int = -1,
) -> int:
    from shoal.frontends.workers import _wire as wire
    from shoal.frontends.workers.arenas import StagingArena
    from shoal.frontends.workers.client import RemoteCore
    from shoal.frontends.workers.dealing import DealtConnections
    from shoal.frontends.workers.outputs import MappedOutputs
    from shoal.supervisor.extensions.log_settings import apply_log_settings

    def on_retired(index: int) -> None:  # an empty segment of the worker's input arena
        if core.direct is not None:
            core.direct.segment_retired(index)
        core.send([wire.RETIRED, 0, index])

    arena = None
    if segments is not None and arena_id >= 0:
        arena = StagingArena(
            arena_id,
            segments,
            initial_bytes=options.arenas.output_initial_bytes,
            growth_bytes=options.arenas.growth_bytes,
            limit_bytes=options.arenas.limit_bytes,
            on_retired=on_retired,
        )
    elif segments is not None:
        segments.close()
    outputs = None if arena is None or segments is None else MappedOutputs(segments, arena)
    core = RemoteCore(control, arena, outputs)
    if options.direct_dispatch and counters >= 0:
        core.enable_direct(index, counters)
    core.on_log_settings = apply_log_settings
    serving: list[HttpServer] = []

    def on_core_lost() -> None:
        for server in serving:
            server.answer_last()

    core.on_core_lost = on_core_lost
    await core.connect(calls)
    if _start_busy_poll(options, asyncio.get_running_loop()):
        core.on_sent = busy_poll.kick
    http, grpc_server, factories = await start_worker_frontends(core, options)
    serving.extend([] if http is None else [http])
    dealt = DealtConnections(deal, factories)
    dealt.start()
    settle_after_start()
    core.send([wire.OK, 0])  # serving: the core may deal connections and announce its ports
    await core.stopping.wait()
    dealt.stop()
    grace = max(core.stop_grace, _CLOSE_SECS)
    stopping = [] if grpc_server is None else [asyncio.ensure_future(grpc_server.stop(grace=grace))]
    if http is not None:
        try:
            await asyncio.wait_for(http.stop(), grace)
        except asyncio.TimeoutError:
            pass
    if stopping:
        await asyncio.gather(*stopping)
    await core.close()
    return 0
