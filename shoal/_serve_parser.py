"""The ``shoal`` command line's parser: the ``serve`` command's flags (tritonserver's names, with
its defaults) and the ``perf`` command's (perf_analyzer's)."""

from __future__ import annotations

import argparse
from typing import Any

import shoal
from shoal import _serve_flags, _triton_flags, perf
from shoal._flag_types import (
    parse_backend_config,
    parse_bool,
    parse_busy_poll,
    parse_positive_int,
    parse_ssl,
    parse_workers,
)
from shoal._network_flags import add_limit_flags, add_network_flags, add_restriction_flags
from shoal.supervisor.extensions.log_settings import LOG_FORMATS
from shoal.supervisor.instances.devices import parse_pool_size

#: A flag: its names and ``add_argument``'s keywords.
Flag = tuple[tuple[str, ...], dict[str, Any]]


def _flag(*names: str, **settings: Any) -> Flag:
    return names, settings


#: Where the models come from, which load, and what a failure to load does.
_MODEL_FLAGS: tuple[Flag, ...] = (
    _flag(
        "--model-repository",
        "--model-store",
        action="append",
        required=True,
        dest="model_repository",
        metavar="PATH",
        help="model repository: a directory, or s3://bucket/path, gs://bucket/path, "
        "az://container/path (repeatable)",
    ),
    _flag(
        "--model-repository-cache",
        default="",
        metavar="DIR",
        help="keep the copies of remote repositories in DIR, reused after a restart "
        "(default: a temporary directory removed at exit)",
    ),
    _flag(
        "--allow-client-shm",
        type=parse_bool,
        default=True,
        help="let clients register and unregister system and CUDA shared-memory regions for "
        "their inputs and outputs; false answers those calls UNSUPPORTED (Triton's flag; its "
        "default is false since 2.69: docs/compatibility.md)",
    ),
    _flag(
        "--model-control-mode",
        type=str.lower,  # any case, as Triton (its own QA passes EXPLICIT)
        choices=["none", "explicit", "poll"],
        default="none",
        help="none: load every model at start; explicit: load --load-model names (* for all) "
        "and then what clients ask for; poll: load everything and follow changes on disk",
    ),
    _flag(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often --model-control-mode=poll looks for changes in the repositories",
    ),
    _flag(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode=explicit: a model to load at start, * for all (repeatable)",
    ),
    _flag(
        "--strict-model-config",
        type=parse_bool,
        default=None,  # absent, so that its deprecation warning names it only when given
        metavar="BOOL",
        help="require a config.pbtxt in every model (false: complete a missing or partial "
        "one from the model's files, as tritonserver does)",
    ),
    _flag(
        "--strict-readiness",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="report the server ready only while every model is ready (false: once it runs)",
    ),
    _flag(
        "--exit-on-error",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="exit with status 1 when a model fails to load at start, as tritonserver does "
        "(false: log it and serve the other models; default: true)",
    ),
    _flag(
        "--backend-config",
        action="append",
        type=parse_backend_config,
        default=[],
        metavar="BACKEND,KEY=VALUE",
        help="<backend>,<setting>=<value>, e.g. python,shm-default-byte-size=67108864",
    ),
)

#: The servers, metrics, shutdown and tracing.
_SERVER_FLAGS: tuple[Flag, ...] = (
    _flag(
        "--grpc-server",
        choices=("native", "grpcio"),
        default="native",
        help="native: shoal's HTTP/2 gRPC server on the event loop (the fastest); "
        "grpcio: grpc.aio's server",
    ),
    _flag(
        "--frontend-workers",
        type=parse_workers,
        default="auto",
        metavar="N|auto",
        help="processes that serve HTTP and gRPC (parsing, encoding, sockets) around the "
        "scheduling core, on the same ports; 1 serves them in the core's process (no hop); "
        "auto (the default): one per two cores beyond the first, at most 8 (1 on two cores)",
    ),
    _flag(
        "--direct-dispatch",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="with frontend workers: plain requests for a plain model (default scheduler, "
        "inputs inline in the request) go from the worker straight to a stub's ring, without "
        "the scheduling core (docs/decisions.md); false: every request through the core",
    ),
    _flag(
        "--busy-poll-us",
        type=parse_busy_poll,
        default="auto",
        metavar="US|auto",
        help="how long the core and the frontend workers keep polling for an answer after "
        "sending work out, instead of sleeping (adapted to the waits seen, at most US); 0 "
        "never; auto (the default): 100 where a core is left over after the core, the "
        "workers and the stubs have one each, else 200 only while a quarter of the machine's "
        "cores (3 at least) are idle (never on two cores)",
    ),
    _flag(
        "--metrics-interval-ms",
        type=parse_positive_int,
        default=2000,
        metavar="MS",
        help="how long a polled gauge (a stub's RSS) is reused; other metrics are computed "
        "on each scrape",
    ),
    _flag(
        "--allow-gpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="accepted for tritonserver compatibility; shoal exports no GPU metrics",
    ),
    _flag(
        "--allow-cpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="export Triton's host CPU families (nv_cpu_utilization, nv_cpu_memory_*)",
    ),
    _flag(
        "--backend-directory",
        default="/opt/tritonserver/backends",
        metavar="DIR",
        help='where Python-based backends live: backend "<name>" runs <dir>/<name>/model.py',
    ),
    _flag(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long requests in flight may finish before shoal stops",
    ),
    _flag(
        "--trace-config",
        action="append",
        default=[],
        help="Triton's [<mode>,]<setting>=<value>: level=TIMESTAMPS, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH (the trace file), "
        "triton,log-frequency=N (repeatable)",
    ),
    _flag(
        "--trace-overhead",
        action="store_true",
        help="record each request's time per pipeline stage (shoal_request_stage_* metrics)",
    ),
)

_LOGGING_FLAGS: tuple[Flag, ...] = (
    _flag(
        "--log-verbose",
        type=int,
        default=0,
        metavar="LEVEL",
        help="verbose logging level: 0 turns it off, 1 or more adds the debug lines",
    ),
    *(
        _flag(
            f"--log-{level}",
            type=parse_bool,
            default=True,
            metavar="BOOL",
            help=f"log {level} lines",
        )
        for level in ("info", "warning", "error")
    ),
    _flag(
        "--log-format",
        choices=LOG_FORMATS,
        default="default",
        help='timestamps as "LMMDD hh:mm:ss.ssssss" (default) or "YYYY-MM-DDThh:mm:ssZ L"',
    ),
    _flag(
        "--log-file",
        default="",
        metavar="FILE",
        help="append the server log (and the models' output) to this file instead of stdout "
        "(INFO and verbose lines) and stderr (warnings and errors)",
    ),
)

#: tritonserver flags that shoal accepts so that scripts keep working, and ignores; then the
#: CUDA pools, and TLS (which only "false" passes).
_COMPATIBILITY_FLAGS: tuple[Flag, ...] = (
    *(
        _flag(
            flag,
            type=kind,
            metavar="VALUE",
            help="accepted for tritonserver compatibility; no effect in shoal",
        )
        for flag, kind in (
            ("--cache-directory", str),
            ("--grpc-infer-allocation-pool-size", int),
            ("--http-thread-count", int),
            ("--pinned-memory-pool-byte-size", int),
        )
    ),
    _flag(
        "--cuda-memory-pool-byte-size",
        type=parse_pool_size,
        action="append",
        default=[],
        metavar="DEVICE:BYTES",
        help="<device>:<bytes> (repeatable): the most device memory the CUDA pool of that GPU "
        "may hold for GPU tensors passed between processes (default 4 GiB, allocated as used)",
    ),
    *(
        _flag(
            flag,
            type=parse_ssl,
            default=False,
            metavar="BOOL",
            help="false only: shoal serves gRPC without TLS (terminate TLS in front of it)",
        )
        for flag in ("--grpc-use-ssl", "--grpc-use-ssl-mutual")
    ),
)

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shoal {shoal.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    _add_serve_flags(
        commands.add_parser(
            "serve",
            help="serve a Triton-style model repository",
            description="Serve the models of one or more Triton-style model repositories over\n"
            "HTTP/REST, gRPC and metrics endpoints (tritonserver's flag names).",
            formatter_class=_HelpFormatter,
        )
    )
    perf.add_arguments(
        commands.add_parser(
            "perf",
            help="load-test a KServe V2 server (perf_analyzer's flag names)",
            formatter_class=_HelpFormatter,
        )
    )
    return parser


def _add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """In the order ``--help`` lists them."""
    _add(serve, _MODEL_FLAGS)
    add_network_flags(serve)
    _add(serve, _SERVER_FLAGS)
    add_limit_flags(serve)
    _add(serve, _LOGGING_FLAGS)
    add_restriction_flags(serve)
    _add(serve, _COMPATIBILITY_FLAGS)
    _serve_flags.add_arguments(serve)
    _triton_flags.add_arguments(serve)


def _add(serve: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    for names, settings in flags:
        serve.add_argument(*names, **settings)
