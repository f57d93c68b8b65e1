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
from collections.abc import Callable, Sequence
from typing import NoReturn

import shoal
from shoal import _serve_flags, perf
from shoal.frontends._restricted import GROUPS as RESTRICTED_GROUPS
from shoal.supervisor.extensions.log_settings import LOG_FORMATS, configure_logging
from shoal.supervisor.extensions.trace_settings import parse_trace_config
from shoal.supervisor.instances.devices import parse_pool_size
from shoal.supervisor.options import MIB, ArenaOptions, Restriction, ServerOptions

# What ``shoal --help`` shows: the module docstring above is for the code's readers.
_DESCRIPTION = """\
shoal serves a Triton-style model repository (config.pbtxt + <version>/model.py) over the
KServe V2 protocol: HTTP/REST, gRPC and Prometheus metrics, with tritonserver's flag names.
Existing Triton clients and tools (tritonclient, perf_analyzer, genai-perf) work unmodified."""

_EPILOG = """\
examples:
  shoal serve --model-repository ./model_repository
  shoal serve --model-repository s3://bucket/models --model-control-mode explicit --load-model '*'
  shoal perf -m add_sub -u localhost:8000 --concurrency-range 1:8:2

'shoal <command> --help' lists the flags of a command and their defaults."""

#: tritonserver flags that shoal accepts so that scripts keep working, and ignores.
_IGNORED_FLAGS: tuple[tuple[str, Callable[[str], object]], ...] = (
    ("--cache-directory", str),
    ("--grpc-infer-allocation-pool-size", int),
    ("--http-thread-count", int),
    ("--pinned-memory-pool-byte-size", int),
)


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0  # reported below
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def auto_frontend_workers(cores: int | None = None) -> int:
    """``--frontend-workers auto``: leave the core and the stubs cores of their own."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return max(1, min(8, (cores - 1) // 2))


def parse_workers(text: str) -> int:
    if text.strip().lower() == "auto":
        return auto_frontend_workers()
    return parse_positive_int(text)


def parse_backend_config(text: str) -> tuple[str, str, str]:
    """``python,shm-default-byte-size=1048576`` → ('python', 'shm-default-byte-size', '1048576')."""
    backend, sep, setting = text.partition(",")
    key, eq, value = setting.partition("=")
    if not sep or not eq or not backend or not key:
        raise argparse.ArgumentTypeError(
            f"--backend-config expects <backend>,<setting>=<value>, got '{text}'"
        )
    return backend, key, value


def _trace_settings(entries: list[str]) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    try:
        settings = parse_trace_config(entries)
    except ValueError as error:
        raise SystemExit(f"shoal: {error}") from None
    return tuple(
        (key, value if isinstance(value, str) else tuple(value)) for key, value in settings.items()
    )


def restriction_parser(kind: str) -> Callable[[str], Restriction]:
    """The argparse type of ``<group>[,<group>...]:<key>=<value>`` (Triton's syntax: the groups
    end at the first ':', the key at the next '='); ``kind`` is "api" or "protocol"."""

    def parse(text: str) -> Restriction:
        groups, colon, setting = text.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and groups and key and value):
            raise argparse.ArgumentTypeError(f"expects <{kind} list>:<key>=<value>, got '{text}'")
        apis = tuple(groups.split(","))
        for api in apis:
            if api not in RESTRICTED_GROUPS:
                raise argparse.ArgumentTypeError(
                    f"unknown restricted {kind} '{api}'; known: {', '.join(RESTRICTED_GROUPS)}"
                )
        return Restriction(apis, key, value)

    return parse


def parse_ssl(text: str) -> bool:
    if parse_bool(text):
        raise argparse.ArgumentTypeError(
            "true is not supported: shoal serves gRPC without TLS (terminate TLS in front of it)"
        )
    return False


def _add_restriction_flags(serve: argparse.ArgumentParser) -> None:
    groups = ", ".join(RESTRICTED_GROUPS)
    for flag, kind, header in (
        ("http-restricted-api", "api", "header <key>"),
        ("grpc-restricted-protocol", "protocol", "metadata key triton-grpc-protocol-<key>"),
    ):
        serve.add_argument(
            f"--{flag}",
            action="append",
            type=restriction_parser(kind),
            default=[],
            metavar="SPEC",
            help=f"<{kind}>[,<{kind}>...]:<key>=<value> (repeatable): calls to these groups "
            f"need {header} set to <value>; groups: {groups}",
        )


def _add_logging_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--log-verbose",
        type=int,
        default=0,
        metavar="LEVEL",
        help="verbose logging level: 0 turns it off, 1 or more adds the debug lines",
    )
    for level in ("info", "warning", "error"):
        serve.add_argument(
            f"--log-{level}",
            type=parse_bool,
            default=True,
            metavar="BOOL",
            help=f"log {level} lines",
        )
    serve.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="default",
        help='timestamps as "LMMDD hh:mm:ss.ssssss" (default) or "YYYY-MM-DDThh:mm:ssZ L"',
    )
    serve.add_argument(
        "--log-file",
        default="",
        metavar="FILE",
        help="append the server log (and the models' output) to this file instead of stderr",
    )


def _add_compatibility_flags(serve: argparse.ArgumentParser) -> None:
    for flag, kind in _IGNORED_FLAGS:
        serve.add_argument(
            flag,
            type=kind,
            metavar="VALUE",
            help="accepted for tritonserver compatibility; no effect in shoal",
        )
    serve.add_argument(
        "--cuda-memory-pool-byte-size",
        type=parse_pool_size,
        action="append",
        default=[],
        metavar="DEVICE:BYTES",
        help="<device>:<bytes> (repeatable): the most device memory the CUDA pool of that GPU "
        "may hold for GPU tensors passed between processes (default 4 GiB, allocated as used)",
    )
    for flag in ("--grpc-use-ssl", "--grpc-use-ssl-mutual"):
        serve.add_argument(
            flag,
            type=parse_ssl,
            default=False,
            metavar="BOOL",
            help="false only: shoal serves gRPC without TLS (terminate TLS in front of it)",
        )


def parse_positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
    return value


def _add_connection_flags(serve: argparse.ArgumentParser) -> None:
    """What one client connection may cost (docs/hardening.md)."""
    serve.add_argument(
        "--http-max-header-size",
        type=parse_positive_int,
        default=32 * 1024,
        help="bytes of a request head (request line and headers); more gets 431",
    )
    serve.add_argument(
        "--http-header-timeout-secs",
        type=parse_positive_float,
        default=60.0,
        help="seconds a request head may take to arrive; then 408 and the connection closes",
    )
    serve.add_argument(
        "--http-body-timeout-secs",
        type=parse_positive_float,
        default=60.0,
        help="seconds a request body may go without a byte; then 408 and the connection closes",
    )


def parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'")
    return value


def _add_grpc_limit_flags(serve: argparse.ArgumentParser) -> None:
    """gRPC's message size and HTTP/2 flood limits (docs/hardening.md); the first four are
    Triton's flags, with its defaults."""
    serve.add_argument(
        "--grpc-max-message-size",
        type=parse_positive_int,
        default=2**31 - 1,
        help="bytes of a request message; a larger one is RESOURCE_EXHAUSTED",
    )
    serve.add_argument(
        "--grpc-max-connection-buffer-size",
        type=parse_positive_int,
        default=2**31 - 1,
        help="request bytes one connection may hold across its calls (messages arriving or not "
        "yet taken; at least one message of --grpc-max-message-size): the call that would pass "
        "it is RESOURCE_EXHAUSTED",
    )
    serve.add_argument(
        "--grpc-http2-max-ping-strikes",
        type=parse_count,
        default=2,
        help="PINGs too soon (see the next flag) before the connection is closed; 0: no limit",
    )
    serve.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=parse_count,
        default=300_000,
        help="milliseconds; a PING sooner, with no data sent since the last, is a strike",
    )
    serve.add_argument(
        "--grpc-keepalive-permit-without-calls",
        type=parse_bool,
        default=False,
        help="accept keepalive PINGs on a connection with no call open",
    )
    serve.add_argument(
        "--grpc-http2-max-queued-control-frames",
        type=parse_positive_int,
        default=1000,
        help="PING/SETTINGS ACKs and RST_STREAMs a client that does not read may leave queued",
    )
    serve.add_argument(
        "--grpc-http2-stream-reset-burst",
        type=parse_positive_int,
        default=1000,
        help="streams a client may reset at once (then --grpc-http2-stream-reset-rate a second)",
    )
    serve.add_argument(
        "--grpc-http2-stream-reset-rate",
        type=parse_positive_float,
        default=33.0,
        help="stream resets a second a client may make once its burst is spent",
    )
    serve.add_argument(
        "--grpc-http2-max-empty-frames",
        type=parse_positive_int,
        default=1000,
        help="frames in a row that carry nothing (empty DATA, PRIORITY, unknown types)",
    )
    serve.add_argument(
        "--grpc-read-timeout-secs",
        type=parse_positive_float,
        default=60.0,
        help="seconds without a byte while a preface, frame or message is half-sent; "
        "then the connection is dropped",
    )


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each flag's default after its help, unless the help already says it or the flag
    has none worth showing (an empty list, an unset value, a store_true switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, "", [], argparse.SUPPRESS)
            or isinstance(action, argparse._StoreTrueAction)
        ):
            return text
        shown = str(default).lower() if isinstance(default, bool) else "%(default)s"
        return f"{text} (default: {shown})" if text else f"(default: {shown})"


def _add_endpoint_flags(serve: argparse.ArgumentParser) -> None:
    for protocol, port, what in (
        ("http", 8000, "HTTP/REST (KServe V2)"),
        ("grpc", 8001, "gRPC (KServe V2)"),
        ("metrics", 8002, "Prometheus metrics (/metrics)"),
    ):
        serve.add_argument(
            f"--allow-{protocol}",
            type=parse_bool,
            default=True,
            metavar="BOOL",
            help=f"serve {what}",
        )
        serve.add_argument(
            f"--{protocol}-address",
            default="0.0.0.0",
            metavar="HOST",
            help=f"address the {what} endpoint binds",
        )
        serve.add_argument(
            f"--{protocol}-port",
            type=int,
            default=port,
            metavar="PORT",
            help=f"port of the {what} endpoint; 0 binds a free one (printed at start)",
        )


def _add_model_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        required=True,
        dest="model_repository",
        metavar="PATH",
        help="model repository: a directory, or s3://bucket/path, gs://bucket/path, "
        "az://container/path (repeatable)",
    )
    serve.add_argument(
        "--model-repository-cache",
        default="",
        metavar="DIR",
        help="keep the copies of remote repositories in DIR, reused after a restart "
        "(default: a temporary directory removed at exit)",
    )
    serve.add_argument(
        "--allow-client-shm",
        type=parse_bool,
        default=True,
        help="let clients register and unregister system and CUDA shared-memory regions for "
        "their inputs and outputs; false answers those calls UNSUPPORTED (Triton's flag; its "
        "default is false since 2.69: docs/compatibility.md)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default="none",
        help="none: load every model at start; explicit: load --load-model names (* for all) "
        "and then what clients ask for; poll: load everything and follow changes on disk",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often --model-control-mode=poll looks for changes in the repositories",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode=explicit: a model to load at start, * for all (repeatable)",
    )
    serve.add_argument(
        "--strict-model-config",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="require a config.pbtxt in every model (false: complete a missing or partial "
        "one from the model's files, as tritonserver does)",
    )
    serve.add_argument(
        "--strict-readiness",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="report the server ready only while every model is ready (false: once it runs)",
    )
    serve.add_argument(
        "--exit-on-error",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="exit with status 1 when a model fails to load at start, as tritonserver does "
        "(false: log it and serve the other models; default: true)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        type=parse_backend_config,
        default=[],
        metavar="BACKEND,KEY=VALUE",
        help="<backend>,<setting>=<value>, e.g. python,shm-default-byte-size=67108864",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shoal {shoal.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    serve = commands.add_parser(
        "serve",
        help="serve a Triton-style model repository",
        description="Serve the models of one or more Triton-style model repositories over\n"
        "HTTP/REST, gRPC and metrics endpoints (tritonserver's flag names).",
        formatter_class=_HelpFormatter,
    )
    _add_model_flags(serve)
    _add_endpoint_flags(serve)
    serve.add_argument(
        "--grpc-server",
        choices=("native", "grpcio"),
        default="native",
        help="native: shoal's HTTP/2 gRPC server on the event loop (the fastest); "
        "grpcio: grpc.aio's server",
    )
    serve.add_argument(
        "--frontend-workers",
        type=parse_workers,
        default=1,
        metavar="N|auto",
        help="processes that serve HTTP and gRPC (parsing, encoding, sockets) around the "
        "scheduling core, on the same ports; 1 (the default) serves them in the core's process; "
        "auto: one per two cores beyond the first, at most 8 (1 on two cores)",
    )
    serve.add_argument(
        "--metrics-interval-ms",
        type=parse_positive_int,
        default=2000,
        metavar="MS",
        help="how long a polled gauge (a stub's RSS) is reused; other metrics are computed "
        "on each scrape",
    )
    serve.add_argument(
        "--allow-gpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="accepted for tritonserver compatibility; shoal exports no GPU metrics",
    )
    serve.add_argument(
        "--allow-cpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="export Triton's host CPU families (nv_cpu_utilization, nv_cpu_memory_*)",
    )
    serve.add_argument(
        "--backend-directory",
        default="/opt/tritonserver/backends",
        metavar="DIR",
        help='where Python-based backends live: backend "<name>" runs <dir>/<name>/model.py',
    )
    serve.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long requests in flight may finish before shoal stops",
    )
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        help="Triton's [<mode>,]<setting>=<value>: level=TIMESTAMPS, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH (repeatable)",
    )
    serve.add_argument(
        "--trace-overhead",
        action="store_true",
        help="record each request's time per pipeline stage (shoal_request_stage_* metrics)",
    )
    serve.add_argument(
        "--http-max-input-size",
        type=int,
        default=64 * MIB,
        metavar="BYTES",
        help="the largest HTTP request body accepted (larger ones get 400)",
    )
    _add_connection_flags(serve)
    _add_grpc_limit_flags(serve)
    _add_logging_flags(serve)
    _add_restriction_flags(serve)
    _add_compatibility_flags(serve)
    _serve_flags.add_arguments(serve)
    perf.add_arguments(
        commands.add_parser(
            "perf",
            help="load-test a KServe V2 server (perf_analyzer's flag names)",
            formatter_class=_HelpFormatter,
        )
    )
    return parser


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
        model_repositories=tuple(args.model_repository),
        model_repository_cache=args.model_repository_cache,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_server=args.grpc_server,
        frontend_workers=args.frontend_workers,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_client_shm=args.allow_client_shm,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        strict_model_config=args.strict_model_config,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        trace_overhead=args.trace_overhead,
        trace_settings=_trace_settings(args.trace_config),
        log_verbose=args.log_verbose,
        log_file=args.log_file,
        log_format=args.log_format,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        http_restricted_api=_restrictions(args.http_restricted_api, "api"),
        grpc_restricted_protocol=_restrictions(args.grpc_restricted_protocol, "protocol"),
        http_max_input_size=args.http_max_input_size,
        http_max_header_size=args.http_max_header_size,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_max_connection_buffer_size=args.grpc_max_connection_buffer_size,
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_http2_min_recv_ping_interval_without_data=(
            args.grpc_http2_min_recv_ping_interval_without_data
        ),
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_queued_control_frames=args.grpc_http2_max_queued_control_frames,
        grpc_http2_stream_reset_burst=args.grpc_http2_stream_reset_burst,
        grpc_http2_stream_reset_rate=args.grpc_http2_stream_reset_rate,
        grpc_http2_max_empty_frames=args.grpc_http2_max_empty_frames,
        grpc_read_timeout_secs=args.grpc_read_timeout_secs,
        arenas=_arena_options(args.backend_config),
        backend_config=tuple(args.backend_config),
        backend_directory=args.backend_directory,
        cuda_pool_limits=tuple(args.cuda_memory_pool_byte_size),
        **_serve_flags.options(args),
    )


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
    for child in _child_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    _leave(EXIT_INTERRUPTED)


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
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        options = options_from_args(args)
        try:
            configure_logging(options)
        except OSError as error:
            print(f"shoal: cannot open the log file: {error}", file=sys.stderr)
            return 1
        import uvloop

        from shoal.supervisor.memory.malloc_tuning import keep_large_buffers_mapped

        keep_large_buffers_mapped()
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
