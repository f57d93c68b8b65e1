"""``shoal serve`` flags of the endpoints and of what one client connection may cost: addresses
and ports, HTTP and gRPC limits (docs/hardening.md), restricted APIs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from shoal._flag_types import (
    parse_bool,
    parse_count,
    parse_positive_float,
    parse_positive_int,
    restriction_parser,
)
from shoal.frontends._restricted import GROUPS as RESTRICTED_GROUPS
from shoal.supervisor.options import MIB

#: ``--grpc-infer-response-compression-level``'s values (Triton's).
COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def parse_compression_level(text: str) -> str:
    level = text.lower()  # tritonserver lower-cases the value: LOW starts it
    if level not in COMPRESSION_LEVELS:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(COMPRESSION_LEVELS)}, got '{text}'"
        )
    return level


#: A limit flag: its name, type, default and help.
_Limit = tuple[str, Callable[[str], object], object, str]

#: What one HTTP connection may cost.
_HTTP_LIMITS: tuple[_Limit, ...] = (
    (
        "--http-max-header-size",
        parse_positive_int,
        32 * 1024,
        "bytes of a request head (request line and headers); more gets 431",
    ),
    (
        "--http-header-timeout-secs",
        parse_positive_float,
        60.0,
        "seconds a request head may take to arrive; then 408 and the connection closes",
    ),
    (
        "--http-body-timeout-secs",
        parse_positive_float,
        60.0,
        "seconds a request body may go without a byte; then 408 and the connection closes",
    ),
    (
        "--http-send-timeout-secs",
        parse_positive_float,
        60.0,
        "seconds a response may wait for the client to take more of it; then the connection closes",
    ),
)

#: gRPC's message size and HTTP/2 flood limits; the first four are Triton's flags, with its
#: defaults.
_GRPC_LIMITS: tuple[_Limit, ...] = (
    (
        "--grpc-max-message-size",
        parse_positive_int,
        2**31 - 1,
        "bytes of a request message; a larger one is RESOURCE_EXHAUSTED",
    ),
    (
        "--grpc-http2-max-ping-strikes",
        parse_count,
        2,
        "PINGs too soon (see the next flag) before the connection is closed; 0: no limit",
    ),
    (
        "--grpc-http2-min-recv-ping-interval-without-data",
        parse_count,
        300_000,
        "milliseconds; a PING sooner, with no data sent since the last, is a strike",
    ),
    (
        "--grpc-keepalive-permit-without-calls",
        parse_bool,
        False,
        "accept keepalive PINGs on a connection with no call open",
    ),
    (
        "--grpc-http2-max-queued-control-frames",
        parse_positive_int,
        1000,
        "PING/SETTINGS ACKs and RST_STREAMs a client that does not read may leave queued",
    ),
    (
        "--grpc-http2-stream-reset-burst",
        parse_positive_int,
        1000,
        "streams a client may reset at once (then --grpc-http2-stream-reset-rate a second)",
    ),
    (
        "--grpc-http2-stream-reset-rate",
        parse_positive_float,
        33.0,
        "stream resets a second a client may make once its burst is spent",
    ),
    (
        "--grpc-http2-max-empty-frames",
        parse_positive_int,
        1000,
        "frames in a row that carry nothing (empty DATA, PRIORITY, unknown types)",
    ),
    (
        "--grpc-read-timeout-secs",
        parse_positive_float,
        60.0,
        "seconds without a byte while a preface, frame or message is half-sent; "
        "then the connection is dropped",
    ),
    (
        "--grpc-max-connection-buffer-size",
        parse_positive_int,
        2**31 - 1,
        "request bytes one connection may hold across its calls (messages arriving or not yet "
        "taken; at least one message of --grpc-max-message-size): the call that would pass it "
        "is RESOURCE_EXHAUSTED",
    ),
    (
        "--grpc-send-timeout-secs",
        parse_positive_float,
        60.0,
        "seconds an answer may wait for the client to take more of it (window or socket); "
        "then the connection is ended",
    ),
    (
        "--grpc-max-connection-send-buffer-size",
        parse_positive_int,
        1 << 30,
        "answer bytes one connection may hold waiting for its client: the call whose answer "
        "would pass it (unless nothing waits) is RESOURCE_EXHAUSTED",
    ),
)

#: Triton's keepalive and connection age flags (its defaults; milliseconds).
_GRPC_KEEPALIVE: tuple[_Limit, ...] = (
    (
        "--grpc-keepalive-time",
        parse_positive_int,
        7_200_000,
        "milliseconds without a byte from the client before the server PINGs it",
    ),
    (
        "--grpc-keepalive-timeout",
        parse_positive_int,
        20_000,
        "milliseconds the server waits for any byte after its keepalive PING; then it closes "
        "the connection",
    ),
    (
        "--grpc-http2-max-pings-without-data",
        parse_count,
        2,
        "keepalive PINGs the server sends while it sends no HEADERS or DATA; 0: no limit",
    ),
    (
        "--grpc-max-connection-age",
        parse_count,
        0,
        "milliseconds a connection may live; then GOAWAY: running calls finish, new ones go to "
        "a new connection. 0: no limit",
    ),
    (
        "--grpc-max-connection-age-grace",
        parse_count,
        0,
        "milliseconds calls may still run after --grpc-max-connection-age; then the "
        "connection closes. 0: no limit",
    ),
    (
        "--grpc-infer-response-compression-level",
        parse_compression_level,
        "none",
        "none, low, medium or high (Triton's): ModelInfer and ModelStreamInfer answers go "
        "compressed with gzip or deflate, as the client accepts (grpc-core's choice)",
    ),
)


def add_network_flags(serve: argparse.ArgumentParser) -> None:
    """The endpoint flags; the connection limits and restrictions come later in ``--help``."""
    for protocol, port, what in (
        ("http", 8000, "HTTP/REST (KServe V2)"),
        ("grpc", 8001, "gRPC (KServe V2)"),
        ("metrics", 8002, "Prometheus metrics (/metrics)"),
    ):
        _add_endpoint(serve, protocol, port, what)


def _add_endpoint(serve: argparse.ArgumentParser, protocol: str, port: int, what: str) -> None:
    serve.add_argument(
        f"--allow-{protocol}", type=parse_bool, default=True, metavar="BOOL", help=f"serve {what}"
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


def add_limit_flags(serve: argparse.ArgumentParser) -> None:
    """What one request and one client connection may cost (docs/hardening.md)."""
    serve.add_argument(
        "--http-max-input-size",
        type=_max_input_size,
        default=64 * MIB,
        metavar="BYTES",
        help="the largest HTTP request body accepted (larger ones get 400)",
    )
    for flag, kind, default, text in (*_HTTP_LIMITS, *_GRPC_LIMITS, *_GRPC_KEEPALIVE):
        serve.add_argument(flag, type=kind, default=default, help=text)


def _max_input_size(text: str) -> int:
    size = int(text)
    if size <= 0:  # Triton's check and words
        raise argparse.ArgumentTypeError("Error: --http-max-input-size must be greater than 0.")
    return size


def add_restriction_flags(serve: argparse.ArgumentParser) -> None:
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
