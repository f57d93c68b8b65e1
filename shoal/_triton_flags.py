"""The rest of tritonserver's flags, so that a script written for ``tritonserver`` starts
``shoal serve`` unchanged: those shoal honours (``--id``, ``--model-config-name``,
``--reuse-http-port``, the deprecated ``--trace-*`` flags, ...), those it accepts and ignores
(they tune what shoal does not have), and those it refuses where ignoring them would mislead
(``--allow-sagemaker=true``). Each decision is in docs/compatibility.md, "Flags"."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from shoal._flag_types import parse_bool, parse_count
from shoal.frontends._forwarding import compile_header_pattern

#: The ``--metrics-config`` settings Triton knows, and the value each has in shoal.
_METRICS_SETTINGS = {
    "counter_latencies": "true or false: the nv_inference_*_duration_us counters",
    "summary_latencies": "true or false: the nv_inference_*_summary_us summaries",
    "histogram_latencies": "true or false: the nv_inference_first_response_histogram_ms histogram",
    "summary_quantiles": "<quantile>:<error>,...: the summaries' quantiles",
}
#: The leading number of a text, as C++'s ``std::stod`` reads it (Triton parses quantiles so:
#: ``0.0.1`` is 0.0).
_LEADING_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

#: The deprecated ``--trace-*`` flags and the ``--trace-config`` entry each one stands for.
_TRACE_FLAGS = (
    ("trace_file", "--trace-file", "triton,file="),
    ("trace_level", "--trace-level", "level="),
    ("trace_rate", "--trace-rate", "rate="),
    ("trace_count", "--trace-count", "count="),
    ("trace_log_frequency", "--trace-log-frequency", "triton,log-frequency="),
)

#: The placeholder of each one's --trace-config form in tritonserver's deprecation warning.
_TRACE_FLAG_FORMS = {
    "trace_file": "triton,file=<filepath>",
    "trace_level": "level=<OFF|TIMESTAMPS|TENSORS>",
    "trace_rate": "rate=<rate value>",
    "trace_count": "count=<count value>",
    "trace_log_frequency": "triton,log-frequency=<log frequency value>",
}

#: What Triton's deprecated ``--trace-level`` takes beyond ``--trace-config level=``'s values.
_TRACE_LEVEL_WORDS = {
    "false": "OFF",
    "off": "OFF",
    "true": "TIMESTAMPS",
    "on": "TIMESTAMPS",
    "min": "TIMESTAMPS",
    "max": "TIMESTAMPS",
}


def _false_only(instead: str) -> Callable[[str], bool]:
    """A boolean flag of a feature shoal does not have: ``false`` passes, ``true`` is refused."""

    def parse(text: str) -> bool:
        if parse_bool(text):
            raise argparse.ArgumentTypeError(f"'{text}' is not supported: {instead}")
        return False

    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None


def _pair(first: Callable[[str], object], second: Callable[[str], object], sep: str) -> Any:
    """``<a><sep><b>``, as Triton's ParsePairOption reads it."""

    def parse(text: str) -> tuple[object, object]:
        left, found, right = text.partition(sep)
        if not (found and left and right):
            raise argparse.ArgumentTypeError(f"expected <a>{sep}<b>, got '{text}'")
        return first(left), second(right)

    return parse


def _host_policy(text: str) -> tuple[str, str, str]:
    name, comma, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    if not (comma and equals and name and key and value):
        raise argparse.ArgumentTypeError(f"expects <policy name>,<setting>=<value>, got '{text}'")
    return name, key, value


def _infer_threads(text: str) -> int:
    count = _int(text)
    if not 2 <= count <= 128:
        raise argparse.ArgumentTypeError(f"must be in the range 2 to 128, got '{text}'")
    return count


def _pool_size(text: str) -> int:
    size = _int(text)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got '{text}'")
    return size


def _config_name(text: str) -> str:
    if not text or any(char.isspace() or char in "/\\" for char in text):
        raise argparse.ArgumentTypeError(
            f"expected a file name without spaces or slashes (configs/<name>.pbtxt), got '{text}'"
        )
    return text


def _header_pattern(text: str) -> str:
    """A header name pattern; case-insensitive as Triton's (``(?-i)`` at its start turns that
    off), and checked here so that a typo stops the server before it binds its ports."""
    try:
        compile_header_pattern(text)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"'{text}' is not a regular expression: {error}") from None
    return text


def _metrics_setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not (equals and key and value) or "," in key:
        raise argparse.ArgumentTypeError(f"expects <setting>=<value>, got '{text}'")
    if key not in _METRICS_SETTINGS:
        raise argparse.ArgumentTypeError(
            f"unknown setting '{key}'; known: {', '.join(_METRICS_SETTINGS)}"
        )
    if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
        parse_bool(value)
    elif key == "summary_quantiles":
        parse_quantiles(value)
    return key, value


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """``summary_quantiles``: ``<quantile>:<error>`` pairs separated by commas. Each number is
    read as Triton reads it (its leading number); a pair without one, or a quantile outside
    0..1, is refused (Triton logs it and leaves the pair out)."""
    pairs = []
    for pair in text.split(","):
        quantile, colon, error = pair.partition(":")
        if not colon:
            raise argparse.ArgumentTypeError(
                f"summary_quantiles: no ':' in '{pair}': expected <quantile>:<error>"
            )
        q, e = _leading_number(quantile, pair), _leading_number(error, pair)
        if not 0.0 <= q <= 1.0:
            raise argparse.ArgumentTypeError(
                f"summary_quantiles: quantile {quantile} in '{pair}' must be between 0 and 1"
            )
        pairs.append((q, e))
    return tuple(pairs)


def _leading_number(text: str, pair: str) -> float:
    match = _LEADING_NUMBER.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"summary_quantiles: '{text}' in '{pair}' is not a number: expected <quantile>:<error>"
        )
    return float(match.group())


def _flag(*names: str, **settings: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return names, settings


_IGNORED = "accepted for tritonserver compatibility; no effect in shoal"
_NO_TLS = (
    "accepted for tritonserver compatibility; no effect: as tritonserver without "
    "--grpc-use-ssl=true, which shoal refuses (no TLS)"
)

#: The flags that change what shoal does.
_HONOURED = (
    _flag(
        "--id",
        default="triton",
        metavar="ID",
        help="the server's name in GET /v2 and gRPC ServerMetadata (tritonserver's default: "
        "clients such as tritonclient's examples check that it is triton)",
    ),
    _flag(
        "--disable-auto-complete-config",
        action="store_true",
        help="require a complete config.pbtxt in every model: the same switch as "
        "--strict-model-config=true",
    ),
    _flag(
        "--model-config-name",
        type=_config_name,
        default=None,
        metavar="NAME",
        help="load <model>/configs/<NAME>.pbtxt instead of <model>/config.pbtxt where it exists",
    ),
    _flag(
        "--model-load-thread-count",
        type=_int,
        default=4,
        metavar="N",
        help="start at most N model versions at once when loading the repository (at start, "
        "by polling, an ensemble's steps; below 1 means 1). Loads asked for by a client or a "
        "model are not held back",
    ),
    _flag(
        "--model-load-retry-count",
        type=parse_count,
        default=0,
        metavar="N",
        help="load a model that failed to load up to N more times before giving up",
    ),
    *(
        _flag(
            f"--reuse-{protocol}-port",
            type=parse_bool,
            default=False,
            metavar="BOOL",
            help=f"bind the {what} port with SO_REUSEPORT: several servers (all with this "
            "flag) share it, the kernel spreading connections between them",
        )
        for protocol, what in (("http", "HTTP"), ("grpc", "gRPC"))
    ),
    *(
        _flag(
            f"--{protocol}-header-forward-pattern",
            type=_header_pattern,
            default="",
            metavar="REGEX",
            help=f"{what} {kind} whose names match REGEX (case-insensitive unless it starts "
            "with (?-i)) become string parameters of the inference request, which a model "
            "reads with request.parameters()",
        )
        for protocol, what, kind in (("http", "HTTP", "headers"), ("grpc", "gRPC", "metadata"))
    ),
    _flag(
        "--metrics-config",
        action="append",
        type=_metrics_setting,
        default=[],
        metavar="SETTING=VALUE",
        help="counter_latencies=false drops the nv_inference_*_duration_us counters; "
        "summary_latencies=true adds the nv_inference_*_summary_us summaries, with "
        "summary_quantiles=<quantile>:<error>,... (default 0.5:0.05,0.9:0.01,0.95:0.001,"
        "0.99:0.001,0.999:0.001); histogram_latencies=true adds "
        "nv_inference_first_response_histogram_ms (repeatable)",
    ),
    *(
        _flag(
            flag,
            default=None,
            # Levels add up, as tritonserver's do; the other settings: the last one given.
            action="append" if flag == "--trace-level" else "store",
            metavar="VALUE",
            help=f"deprecated form of --trace-config {entry}",
        )
        for _, flag, entry in _TRACE_FLAGS
    ),
)

#: Accepted and ignored, with Triton's value syntax (a typo is still an error).
_IGNORED_FLAGS = tuple(
    _flag(flag, type=kind, metavar=metavar, help=text)
    for flag, kind, metavar, text in (
        ("--buffer-manager-thread-count", _int, "N", _IGNORED),
        ("--grpc-infer-thread-count", _infer_threads, "N", _IGNORED),
        ("--grpc-max-response-pool-size", _pool_size, "N", _IGNORED),
        ("--model-load-gpu-limit", _pair(_int, _float, ":"), "DEVICE:FRACTION", _IGNORED),
        ("--cuda-virtual-address-size", _pair(_int, _int, ":"), "DEVICE:BYTES", _IGNORED),
        ("--host-policy", _host_policy, "NAME,SETTING=VALUE", _IGNORED),
        ("--min-supported-compute-capability", _float, "CC", _IGNORED),
        ("--enable-peer-access", parse_bool, "BOOL", _IGNORED),
        ("--repoagent-directory", str, "DIR", _IGNORED),
        ("--grpc-server-cert", str, "FILE", _NO_TLS),
        ("--grpc-server-key", str, "FILE", _NO_TLS),
        ("--grpc-root-cert", str, "FILE", _NO_TLS),
        ("--sagemaker-port", _int, "PORT", f"{_IGNORED} (no SageMaker endpoint)"),
        ("--sagemaker-safe-port-range", _pair(_int, _int, "-"), "LOW-HIGH", _IGNORED),
        ("--sagemaker-thread-count", _int, "N", _IGNORED),
        ("--vertex-ai-port", _int, "PORT", f"{_IGNORED} (no Vertex AI endpoint)"),
        ("--vertex-ai-thread-count", _int, "N", _IGNORED),
        ("--vertex-ai-default-model", str, "NAME", _IGNORED),
    )
)

#: Honouring ``true`` is impossible and ignoring it would mislead: only ``false`` passes.
_REFUSED_FLAGS = tuple(
    _flag(
        flag,
        type=_false_only(instead),
        default=False,
        metavar="BOOL",
        help=f"false only: {instead}",
    )
    for flag, instead in (
        (
            "--allow-sagemaker",
            "shoal has no SageMaker endpoint (serve /invocations behind a proxy to the KServe "
            "V2 HTTP endpoint)",
        ),
        (
            "--allow-vertex-ai",
            "shoal has no Vertex AI endpoint (point Vertex AI at the KServe V2 HTTP endpoint)",
        ),
        (
            "--model-namespacing",
            "shoal serves one model per name (give the models in different repositories "
            "different names)",
        ),
    )
)


def add_arguments(serve: argparse.ArgumentParser) -> None:
    for names, settings in (*_HONOURED, *_IGNORED_FLAGS, *_REFUSED_FLAGS):
        serve.add_argument(*names, **settings)


def trace_entries(args: argparse.Namespace) -> list[str]:
    """The ``--trace-config`` entries the deprecated ``--trace-*`` flags stand for, followed by
    ``--trace-config``'s own, which win (as in Triton; levels add up)."""
    entries = []
    for attribute, _, entry in _TRACE_FLAGS:
        value = getattr(args, attribute)
        if value is None:
            continue
        if attribute == "trace_level":  # repeatable
            entries += [f"{entry}{_TRACE_LEVEL_WORDS.get(v.lower(), v)}" for v in value]
        else:
            entries.append(f"{entry}{value}")
    return [*entries, *args.trace_config]


def warnings(args: argparse.Namespace) -> list[str]:
    """What tritonserver prints on stderr at start for these deprecated flags, in its words
    (scripts grep them), once per use as it does."""
    lines = []
    for attribute, flag, _ in _TRACE_FLAGS:
        value = getattr(args, attribute)
        if value is None:
            continue
        uses = len(value) if isinstance(value, list) else 1
        lines += [
            f"Warning: '{flag}' has been deprecated and will be removed in future releases. "
            f"Please use '--trace-config {_TRACE_FLAG_FORMS[attribute]} instead."
        ] * uses
    if args.strict_model_config is not None:
        lines.append(
            "Warning: '--strict-model-config' has been deprecated! "
            "Please use '--disable-auto-complete-config' instead."
        )
    if args.disable_auto_complete_config and args.strict_model_config is False:
        lines.append(
            "Warning: Overriding deprecated '--strict-model-config' from "
            "False to True in favor of '--disable-auto-complete-config'!"
        )
    if args.response_cache_byte_size is not None:
        lines.append(
            "Warning: '--response-cache-byte-size' has been deprecated! This will default to "
            "the 'local' cache implementation with the provided byte size for its config. "
            "Please use '--cache-config' instead. The equivalent --cache-config CLI args would "
            f"be: '--cache-config=local,size={args.response_cache_byte_size}'"
        )
    return lines


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields these flags set (besides the trace entries)."""
    metrics = dict(args.metrics_config)
    return {
        "server_id": args.id,
        "strict_model_config": args.strict_model_config or args.disable_auto_complete_config,
        "model_config_name": args.model_config_name or "",
        "model_load_retry_count": args.model_load_retry_count,
        "model_load_thread_count": args.model_load_thread_count,
        "reuse_http_port": args.reuse_http_port,
        "reuse_grpc_port": args.reuse_grpc_port,
        "http_header_forward_pattern": args.http_header_forward_pattern,
        "grpc_header_forward_pattern": args.grpc_header_forward_pattern,
        "counter_latencies": parse_bool(metrics.get("counter_latencies", "true")),
        "summary_latencies": parse_bool(metrics.get("summary_latencies", "false")),
        "histogram_latencies": parse_bool(metrics.get("histogram_latencies", "false")),
        "summary_quantiles": (
            parse_quantiles(metrics["summary_quantiles"]) if "summary_quantiles" in metrics else ()
        ),
    }
