"""Every tritonserver flag ``shoal serve`` takes over from ``src/command_line_parser.cc``: it
parses in both forms, its value reaches the server's options, and a refused value says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal import _triton_flags
from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.config.loader import config_path, read_config
from shoal.core import InvalidArgument
from shoal.frontends._forwarding import HeaderForward
from shoal.supervisor.options import ServerOptions

pytestmark = pytest.mark.timeout(60)


def _options(*flags: str) -> ServerOptions:
    return options_from_args(
        build_parser().parse_args(["serve", "--model-repository", "r", *flags])
    )


def _refused(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--model-repository", "r", *flags])
    assert info.value.code == 2
    return capsys.readouterr().err


#: Flags that change what shoal does: (flags, ServerOptions field, value).
HONOURED = [
    (("--id", "edge-7"), "server_id", "edge-7"),
    (("--id=edge-7",), "server_id", "edge-7"),
    ((), "server_id", "triton"),
    (("--disable-auto-complete-config",), "strict_model_config", True),
    (
        ("--strict-model-config=false", "--disable-auto-complete-config"),
        "strict_model_config",
        True,
    ),
    ((), "strict_model_config", False),
    (("--model-config-name", "h100"), "model_config_name", "h100"),
    ((), "model_config_name", ""),
    (("--model-load-retry-count=3",), "model_load_retry_count", 3),
    (("--model-load-thread-count=2",), "model_load_thread_count", 2),
    ((), "model_load_thread_count", 4),
    (("--reuse-http-port", "true"), "reuse_http_port", True),
    (("--reuse-http-port=0",), "reuse_http_port", False),
    (("--reuse-grpc-port=ON",), "reuse_grpc_port", True),
    (("--http-header-forward-pattern", "PREFIX_.*"), "http_header_forward_pattern", "PREFIX_.*"),
    (("--grpc-header-forward-pattern=(?-i)x-.*",), "grpc_header_forward_pattern", "(?-i)x-.*"),
    (("--metrics-config", "counter_latencies=false"), "counter_latencies", False),
    (("--metrics-config=summary_latencies=false",), "counter_latencies", True),
    (("--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01",), "counter_latencies", True),
    (("--metrics-config=histogram_latencies=false",), "counter_latencies", True),
    ((), "summary_latencies", False),
    ((), "histogram_latencies", False),
    ((), "summary_quantiles", ()),
    (("--metrics-config", "summary_latencies=true"), "summary_latencies", True),
    (("--metrics-config=histogram_latencies=1",), "histogram_latencies", True),
    (
        ("--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01",),
        "summary_quantiles",
        ((0.5, 0.05), (0.9, 0.01)),
    ),
    # Triton's own QA passes "0.0.1": std::stod reads its leading number, 0.0.
    (
        ("--metrics-config=summary_quantiles=0.1:0.0.1,0.75:1e-2",),
        "summary_quantiles",
        ((0.1, 0.0), (0.75, 0.01)),
    ),
    (("--model-control-mode=EXPLICIT",), "model_control_mode", "explicit"),
    (("--model-control-mode", "Poll"), "model_control_mode", "poll"),
]


@pytest.mark.parametrize(("flags", "field", "value"), HONOURED)
def test_honoured_flags_reach_the_options(
    flags: tuple[str, ...], field: str, value: object
) -> None:
    assert getattr(_options(*flags), field) == value


def _triton_warnings(*flags: str) -> list[str]:
    args = build_parser().parse_args(["serve", "--model-repository", "r", *flags])
    return _triton_flags.warnings(args)


def test_strict_model_config_warns_in_tritonservers_words() -> None:
    # Triton's L0_model_config greps stderr for these lines
    deprecated = (
        "Warning: '--strict-model-config' has been deprecated! "
        "Please use '--disable-auto-complete-config' instead."
    )
    overriding = (
        "Warning: Overriding deprecated '--strict-model-config' from "
        "False to True in favor of '--disable-auto-complete-config'!"
    )
    assert _triton_warnings() == []
    assert _triton_warnings("--disable-auto-complete-config") == []
    assert _triton_warnings("--strict-model-config=true") == [deprecated]
    assert _triton_warnings("--strict-model-config=true", "--disable-auto-complete-config") == [
        deprecated
    ]
    both = _triton_warnings("--disable-auto-complete-config", "--strict-model-config=false")
    assert both == [deprecated, overriding]


def _trace(*flags: str) -> dict[str, object]:
    return dict(_options(*flags).trace_settings)


def test_deprecated_trace_flags_map_onto_trace_config() -> None:
    settings = _trace(
        "--trace-file=/tmp/t.json",
        "--trace-level",
        "TIMESTAMPS",
        "--trace-rate=5",
        "--trace-count",
        "10",
        "--trace-log-frequency=2",
    )
    assert settings == {
        "trace_file": "/tmp/t.json",
        "trace_level": ("TIMESTAMPS",),
        "trace_rate": "5",
        "trace_count": "10",
        "log_frequency": "2",
    }


def test_trace_config_wins_over_the_deprecated_flags_and_levels_add_up() -> None:
    settings = _trace("--trace-rate=5", "--trace-config", "rate=9", "--trace-level=max")
    assert settings["trace_rate"] == "9"
    settings = _trace("--trace-level=tensors", "--trace-config", "level=TIMESTAMPS")
    assert set(settings["trace_level"]) == {"TIMESTAMPS", "TENSORS"}  # type: ignore[arg-type]
    assert _trace("--trace-level=off")["trace_level"] == ("OFF",)


def test_repeated_trace_levels_add_up_and_an_off_turns_tracing_off() -> None:
    """tritonserver ORs every level given and, once any is OFF, starts with tracing off."""
    settings = _trace("--trace-level=TIMESTAMPS", "--trace-level=TENSORS")
    assert set(settings["trace_level"]) == {"TIMESTAMPS", "TENSORS"}  # type: ignore[arg-type]
    assert _trace("--trace-level=OFF", "--trace-level=TENSORS")["trace_level"] == ("OFF",)
    off = _trace("--trace-level=OFF", "--trace-config", "level=TIMESTAMPS")
    assert off["trace_level"] == ("OFF",)
    assert _trace("--trace-config", "level=TENSORS", "--trace-config", "level=OFF")[
        "trace_level"
    ] == ("OFF",)


def test_a_bad_deprecated_trace_value_stops_the_server() -> None:
    with pytest.raises(SystemExit, match="rate"):
        _options("--trace-rate=often")


def _warnings(*flags: str) -> list[str]:
    args = build_parser().parse_args(["serve", "--model-repository", "r", *flags])
    return _triton_flags.warnings(args)


def test_deprecated_flags_warn_in_tritonservers_words_once_per_use() -> None:
    # Triton's QA (L0_cmdline_trace) greps these lines, one per flag given.
    lines = _warnings(
        *("--trace-file=t.json", "--trace-rate=100", "--trace-level=TIMESTAMPS"),
        *("--trace-level=TENSORS", "--trace-log-frequency=50", "--trace-count=100"),
        *("--strict-model-config=false", "--response-cache-byte-size=1024"),
    )
    assert lines == [
        "Warning: '--trace-file' has been deprecated and will be removed in future releases. "
        "Please use '--trace-config triton,file=<filepath> instead.",
        *[
            "Warning: '--trace-level' has been deprecated and will be removed in future "
            "releases. Please use '--trace-config level=<OFF|TIMESTAMPS|TENSORS> instead."
        ]
        * 2,
        "Warning: '--trace-rate' has been deprecated and will be removed in future releases. "
        "Please use '--trace-config rate=<rate value> instead.",
        "Warning: '--trace-count' has been deprecated and will be removed in future releases. "
        "Please use '--trace-config count=<count value> instead.",
        "Warning: '--trace-log-frequency' has been deprecated and will be removed in future "
        "releases. Please use '--trace-config triton,log-frequency=<log frequency value> "
        "instead.",
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead.",
        "Warning: '--response-cache-byte-size' has been deprecated! This will default to the "
        "'local' cache implementation with the provided byte size for its config. Please use "
        "'--cache-config' instead. The equivalent --cache-config CLI args would be: "
        "'--cache-config=local,size=1024'",
    ]
    assert _warnings("--trace-config", "rate=5", "--disable-auto-complete-config") == []


#: Accepted, no effect, with Triton's value forms.
IGNORED = [
    ("--buffer-manager-thread-count", "4"),
    ("--grpc-infer-thread-count", "8"),
    ("--grpc-max-response-pool-size", "32"),
    ("--model-load-gpu-limit", "0:0.5"),
    ("--cuda-virtual-address-size", "0:1073741824"),
    ("--host-policy", "gpu0,numa-node=0"),
    ("--min-supported-compute-capability", "6.0"),
    ("--enable-peer-access", "false"),
    ("--repoagent-directory", "/opt/tritonserver/repoagents"),
    ("--grpc-server-cert", "server.crt"),
    ("--grpc-server-key", "server.key"),
    ("--grpc-root-cert", "ca.crt"),
    ("--sagemaker-port", "8080"),
    ("--sagemaker-safe-port-range", "8000-8002"),
    ("--sagemaker-thread-count", "8"),
    ("--vertex-ai-port", "8080"),
    ("--vertex-ai-thread-count", "8"),
    ("--vertex-ai-default-model", "m"),
    ("--allow-sagemaker", "false"),
    ("--allow-vertex-ai", "0"),
    ("--model-namespacing", "false"),
]


@pytest.mark.parametrize(("flag", "value"), IGNORED)
def test_ignored_flags_parse_in_both_forms(flag: str, value: str) -> None:
    assert _options(flag, value) == _options() == _options(f"{flag}={value}")


#: (flag, value, what the error says besides the flag's name).
REFUSED = [
    ("--allow-sagemaker", "true", "no SageMaker endpoint"),
    ("--allow-vertex-ai", "on", "no Vertex AI endpoint"),
    ("--model-namespacing", "1", "one model per name"),
    ("--allow-sagemaker", "maybe", "expected true or false"),
    ("--grpc-infer-thread-count", "1", "range 2 to 128"),
    ("--grpc-max-response-pool-size", "0", "greater than 0"),
    ("--model-load-gpu-limit", "0.5", "expected <a>:<b>"),
    ("--host-policy", "numa-node=0", "<policy name>,<setting>=<value>"),
    ("--model-config-name", "", "without spaces"),
    ("--model-config-name", "h 100", "without spaces"),
    ("--model-load-retry-count", "-1", "integer >= 0"),
    ("--reuse-http-port", "yes please", "expected true or false"),
    ("--http-header-forward-pattern", "(", "not a regular expression"),
    ("--metrics-config", "summary_latencies=maybe", "expected true or false"),
    ("--metrics-config", "summary_quantiles=0.5", "no ':' in '0.5'"),
    ("--metrics-config", "summary_quantiles=0.5:0.05,p99:0.001", "'p99' in 'p99:0.001'"),
    ("--metrics-config", "summary_quantiles=1.5:0.01", "quantile 1.5 in '1.5:0.01' must be"),
    ("--metrics-config", "latency=true", "unknown setting 'latency'"),
    ("--metrics-config", "counter_latencies", "<setting>=<value>"),
]


@pytest.mark.parametrize(("flag", "value", "says"), REFUSED)
def test_refused_values_name_the_flag_and_why(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    error = _refused(capsys, f"{flag}={value}")
    assert f"argument {flag}" in error and says in error, error


def test_disable_auto_complete_config_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unrecognized arguments: true" in _refused(
        capsys, "--disable-auto-complete-config", "true"
    )


def test_every_flag_of_tritonserver_is_known() -> None:
    """The long options of Triton 2.73's command line (``command_line_parser.cc``)."""
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    known = {name for action in serve._actions for name in action.option_strings}
    missing = sorted(f"--{flag}" for flag in TRITONSERVER_FLAGS.split() if f"--{flag}" not in known)
    assert not missing


TRITONSERVER_FLAGS = """
help id exit-timeout-secs model-store model-repository exit-on-error disable-auto-complete-config
strict-readiness model-control-mode repository-poll-secs load-model model-config-name
model-load-thread-count model-load-retry-count model-namespacing enable-peer-access allow-http
http-address http-port reuse-http-port http-header-forward-pattern http-thread-count
http-max-input-size http-restricted-api allow-grpc grpc-address grpc-port reuse-grpc-port
grpc-header-forward-pattern grpc-infer-thread-count grpc-infer-allocation-pool-size
grpc-max-response-pool-size grpc-use-ssl grpc-use-ssl-mutual grpc-server-cert grpc-server-key
grpc-root-cert grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes
grpc-restricted-protocol grpc-keepalive-permit-without-calls log-verbose log-info log-warning
log-error log-format log-file allow-sagemaker sagemaker-port sagemaker-safe-port-range
sagemaker-thread-count allow-vertex-ai vertex-ai-port vertex-ai-thread-count
vertex-ai-default-model allow-metrics allow-gpu-metrics allow-cpu-metrics metrics-address
metrics-port metrics-interval-ms metrics-config trace-config cache-config cache-directory
rate-limit rate-limit-resource pinned-memory-pool-byte-size cuda-memory-pool-byte-size
cuda-virtual-address-size min-supported-compute-capability buffer-manager-thread-count
host-policy model-load-gpu-limit allow-client-shm backend-directory backend-config
repoagent-directory strict-model-config response-cache-byte-size trace-file trace-level
trace-rate trace-count trace-log-frequency
"""


def test_header_forward_matches_anywhere_and_ignores_case_unless_told() -> None:
    forward = HeaderForward("prefix_.*")
    headers = [("PREFIX_a", "1"), ("x-prefix_b", b"2"), ("other", "3")]
    assert forward.matching(headers) == {"PREFIX_a": "1", "x-prefix_b": "2"}
    assert HeaderForward("(?-i)prefix_.*").matching(headers) == {"x-prefix_b": "2"}


@pytest.mark.parametrize("name", ["timeout", "Sequence_ID", "triton_enable_empty_final_response"])
def test_a_reserved_header_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"Header '{name}' is reserved"):
        HeaderForward(".*").matching([(name, "1")])


def test_model_config_name_reads_configs_name_pbtxt_where_it_exists(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 1\n')
    (tmp_path / "configs" / "h100.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    assert config_path(tmp_path, "h100") == tmp_path / "configs" / "h100.pbtxt"
    assert config_path(tmp_path, "v100") == config_path(tmp_path) == tmp_path / "config.pbtxt"
    assert read_config(tmp_path, config_name="h100").proto.max_batch_size == 8
    assert read_config(tmp_path, config_name="v100").proto.max_batch_size == 1
