"""``shoal`` command line: ``shoal serve`` with tritonserver's flag names where they overlap.

Signals are handled here only; library code raises and this module turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from shoal import _early_log, _serve_flags, _triton_flags, perf
from shoal._serve_parser import build_parser
from shoal.supervisor.extensions.log_settings import configure_logging
from shoal.supervisor.extensions.trace_settings import parse_trace_config
from shoal.supervisor.options import ArenaOptions, Restriction, ServerOptions


def _trace_settings(entries: list[str]) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    try:
        settings = parse_trace_config(entries)
    except ValueError as error:
        raise SystemExit(f"shoal: {error}") from None
    return tuple(
        (key, value if isinstance(value, str) else tuple(value)) for key, value in settings.items()
    )


def _arena_options(settings: Sequence[tuple[str, str, str]]) -> ArenaOptions:
    """Triton's python-backend shm knobs, applied to shoal's arenas."""
    values = {}
    for backend, key, value in settings:
        if backend != "python":
            continue
        try:
            values[key] = int(value)
        except ValueError:
            raise SystemExit(f"shoal: --backend-config python,{key} needs an integer") from None
    defaults = ArenaOptions()
    initial = values.get("shm-default-byte-size")
    return ArenaOptions(
        input_initial_bytes=initial or defaults.input_initial_bytes,
        output_initial_bytes=initial or defaults.output_initial_bytes,
        growth_bytes=values.get("shm-growth-byte-size", defaults.growth_bytes),
        limit_bytes=values.get("shm-limit-byte-size", defaults.limit_bytes),
    )


def _restrictions(specs: Sequence[Restriction], kind: str) -> tuple[Restriction, ...]:
    """The groups of ``--*-restricted-*`` flags; a group may be in one of them only (as Triton)."""
    seen: set[str] = set()
    for spec in specs:
        for api in spec.apis:
            if api in seen:
                raise SystemExit(
                    f"shoal: restricted {kind} '{api}' can not be specified in multiple "
                    "config groups"
                )
            seen.add(api)
    return tuple(specs)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        **_model_options(args),
        **_endpoint_options(args),
        **_limit_options(args),
        **_logging_options(args),
        trace_overhead=args.trace_overhead,
        trace_settings=_trace_settings(_triton_flags.trace_entries(args)),
        arenas=_arena_options(args.backend_config),
        cuda_pool_limits=tuple(args.cuda_memory_pool_byte_size),
        **_serve_flags.options(args),
        **_triton_flags.options(args),
    )


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        # A repository named twice is read once, as Triton keeps them in a set.
        "model_repositories": tuple(dict.fromkeys(args.model_repository)),
        "model_repository_cache": args.model_repository_cache,
        "model_control_mode": args.model_control_mode,
        "repository_poll_secs": args.repository_poll_secs,
        "load_models": tuple(args.load_model),
        "strict_readiness": args.strict_readiness,
        "exit_on_error": args.exit_on_error,
        "exit_timeout_secs": args.exit_timeout_secs,
        "backend_config": tuple(args.backend_config),
        "backend_directory": args.backend_directory,
    }


def _endpoint_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "http_address": args.http_address,
        "http_port": args.http_port,
        "grpc_address": args.grpc_address,
        "grpc_port": args.grpc_port,
        "grpc_server": args.grpc_server,
        "frontend_workers": args.frontend_workers,
        "direct_dispatch": args.direct_dispatch,
        "busy_poll_us": args.busy_poll_us,
        "metrics_address": args.metrics_address,
        "metrics_port": args.metrics_port,
        "allow_http": args.allow_http,
        "allow_grpc": args.allow_grpc,
        "allow_metrics": args.allow_metrics,
        "metrics_interval_ms": args.metrics_interval_ms,
        "allow_cpu_metrics": args.allow_cpu_metrics,
        "allow_client_shm": args.allow_client_shm,
        "http_restricted_api": _restrictions(args.http_restricted_api, "api"),
        "grpc_restricted_protocol": _restrictions(args.grpc_restricted_protocol, "protocol"),
    }


def _limit_options(args: argparse.Namespace) -> dict[str, Any]:
    """What one request and one connection may cost."""
    return {
        "http_max_input_size": args.http_max_input_size,
        "http_max_header_size": args.http_max_header_size,
        "http_header_timeout_secs": args.http_header_timeout_secs,
        "http_body_timeout_secs": args.http_body_timeout_secs,
        "http_send_timeout_secs": args.http_send_timeout_secs,
        "grpc_max_message_size": args.grpc_max_message_size,
        "grpc_max_connection_buffer_size": args.grpc_max_connection_buffer_size,
        "grpc_http2_max_ping_strikes": args.grpc_http2_max_ping_strikes,
        "grpc_http2_min_recv_ping_interval_without_data": (
            args.grpc_http2_min_recv_ping_interval_without_data
        ),
        "grpc_keepalive_permit_without_calls": args.grpc_keepalive_permit_without_calls,
        "grpc_http2_max_queued_control_frames": args.grpc_http2_max_queued_control_frames,
        "grpc_http2_stream_reset_burst": args.grpc_http2_stream_reset_burst,
        "grpc_http2_stream_reset_rate": args.grpc_http2_stream_reset_rate,
        "grpc_http2_max_empty_frames": args.grpc_http2_max_empty_frames,
        "grpc_read_timeout_secs": args.grpc_read_timeout_secs,
        "grpc_send_timeout_secs": args.grpc_send_timeout_secs,
        "grpc_max_connection_send_buffer_size": args.grpc_max_connection_send_buffer_size,
        "grpc_keepalive_time": args.grpc_keepalive_time,
        "grpc_keepalive_timeout": args.grpc_keepalive_timeout,
        "grpc_http2_max_pings_without_data": args.grpc_http2_max_pings_without_data,
        "grpc_max_connection_age": args.grpc_max_connection_age,
        "grpc_max_connection_age_grace": args.grpc_max_connection_age_grace,
        "grpc_infer_response_compression_level": args.grpc_infer_response_compression_level,
    }


def _logging_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "log_verbose": args.log_verbose,
        "log_file": args.log_file,
        "log_format": args.log_format,
        "log_info": args.log_info,
        "log_warning": args.log_warning,
        "log_error": args.log_error,
    }


async def _serve(options: ServerOptions) -> int:
    from shoal.server import run_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            _exit_now(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    code = await run_server(options, stop)
    # Everything the server held is released by now: stubs stopped, segments unlinked, scratch
    # directories removed. Leaving through the event loop's and the interpreter's teardown
    # would wait for worker threads still inflating a hostile body and tear down ~640 modules
    # (about a second on two busy cores): the exit timeout would no longer bound the shutdown.
    _leave(code)


#: Exit status after a second SIGINT/SIGTERM cut the drain short.
EXIT_INTERRUPTED = 1


def _exit_now(sig: signal.Signals) -> NoReturn:
    """A second signal during the drain: stop at once. In-flight requests are cut off; the
    stubs are killed (they would follow anyway: their parent-death signal), memfd arenas vanish
    with the processes, and named segments are swept at the next start."""
    log = logging.getLogger("shoal")
    log.warning("second %s during shutdown: stopping at once", sig.name)
    _kill_children()
    _leave(EXIT_INTERRUPTED)


def _kill_children() -> None:
    for child in _child_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _leave(code: int) -> NoReturn:
    """Exit now with ``code``, once the logs and the standard streams are flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _child_pids() -> list[int]:
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as children:
                pids += [int(pid) for pid in children.read().split()]
    return pids


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        options = options_from_args(args) if args.command == "serve" else None
    except SystemExit:
        _early_log.abandon()  # no server will log to it
        raise
    if options is not None:
        for warning in _triton_flags.warnings(args):
            print(warning, file=sys.stderr)
        try:
            # the file the command opened before its imports (_launch.py)
            configure_logging(options, _early_log.take(options.log_file))
        except OSError as error:
            print(f"shoal: cannot open the log file: {error}", file=sys.stderr)
            return 1
        import uvloop

        from shoal.supervisor.memory.malloc_tuning import keep_large_buffers_mapped
        from shoal.supervisor.open_files import raise_open_file_limit

        keep_large_buffers_mapped()
        before, after = raise_open_file_limit()
        if after != before:
            log = logging.getLogger("shoal")
            log.debug("open files: the limit raised from %d to %d", before, after)
        try:
            return int(uvloop.run(_serve(options)))
        except (FileNotFoundError, OSError) as error:
            logging.getLogger("shoal").error("%s", error)
            return 1
    if args.command == "perf":
        return perf.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
