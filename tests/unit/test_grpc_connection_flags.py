"""tritonserver's gRPC keepalive, connection age and compression flags, and shoal's send limits:
scripts that pass them keep working, and they reach the connection limits both servers use."""

from __future__ import annotations

import pytest

from shoal._endpoints import _flood_limits
from shoal._serve_parser import build_parser
from shoal.cli import options_from_args

pytestmark = pytest.mark.timeout(60)

TRITON_FLAGS = [
    "--grpc-keepalive-time=10000",
    "--grpc-keepalive-timeout=5000",
    "--grpc-http2-max-pings-without-data=0",
    "--grpc-max-connection-age=60000",
    "--grpc-max-connection-age-grace=3000",
    "--grpc-infer-response-compression-level=high",
]


def test_tritonservers_keepalive_flags_parse_and_reach_the_limits() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "r", *TRITON_FLAGS])
    options = options_from_args(args)
    assert options.grpc_infer_response_compression_level == "high"
    limits = _flood_limits(options)
    assert (limits.keepalive_time, limits.keepalive_timeout) == (10.0, 5.0)
    assert limits.max_pings_without_data == 0
    assert (limits.max_age, limits.max_age_grace) == (60.0, 3.0)


def test_the_defaults_are_tritons_and_shoals() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "r"])
    limits = _flood_limits(options_from_args(args))
    assert (limits.keepalive_time, limits.keepalive_timeout) == (7200.0, 20.0)
    assert limits.max_pings_without_data == 2
    assert (limits.max_age, limits.max_age_grace) == (0.0, 0.0)
    assert (limits.send_timeout, limits.max_send_buffer) == (60.0, 1 << 30)


def test_the_send_limits_are_flags() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model-repository",
            "r",
            "--grpc-send-timeout-secs=2.5",
            "--grpc-max-connection-send-buffer-size=4096",
        ]
    )
    limits = _flood_limits(options_from_args(args))
    assert (limits.send_timeout, limits.max_send_buffer) == (2.5, 4096)


def test_an_unknown_compression_level_names_the_flag_and_the_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["serve", "--model-repository", "r", "--grpc-infer-response-compression-level=max"]
        )
    error = capsys.readouterr().err
    assert "--grpc-infer-response-compression-level" in error
    assert "none, low, medium, high" in error and "'max'" in error


@pytest.mark.parametrize("given", ["LOW", "Low", "low"])
def test_a_compression_level_in_any_case_is_tritons(given: str) -> None:
    """tritonserver lower-cases the value before it checks it."""
    args = build_parser().parse_args(
        ["serve", "--model-repository", "r", f"--grpc-infer-response-compression-level={given}"]
    )
    assert options_from_args(args).grpc_infer_response_compression_level == "low"
