"""``shoal perf``: the arguments, and turning a run's results into output files and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from shoal.perf.errors import PerfError
from shoal.perf.report import format_table, plot, write_csv, write_json
from shoal.perf.runner import CLIENTS, PROTOCOLS, RunConfig, run
from shoal.perf.stats import CellResult
from shoal.perf.sweep import parse_concurrency
from shoal.perf.tensors import parse_input_spec

T = TypeVar("T")


def _argument(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--url", default="", help="host:port (default 127.0.0.1:8000 or :8001)")
    target.add_argument("--protocol", choices=PROTOCOLS, default="http")
    target.add_argument("--model", "-m", required=True)
    target.add_argument("--model-version", default="")
    data = parser.add_argument_group("inputs (default: every input from the model's metadata)")
    data.add_argument(
        "--input",
        action="append",
        type=_argument(parse_input_spec),
        default=[],
        metavar="NAME:DATATYPE:SHAPE",
        help="an input with random data, e.g. INPUT0:FP32:1,16 (repeatable)",
    )
    data.add_argument(
        "--bytes", type=int, default=None, help="size each metadata input to this many bytes"
    )
    data.add_argument("--input-data", type=Path, help="a V2 JSON request body with the inputs")
    load = parser.add_argument_group("load")
    load.add_argument(
        "--concurrency",
        "-c",
        type=_argument(parse_concurrency),
        default=(1,),
        help="one level or a sweep: 8, 1,8,64 or 1:64 (doubling)",
    )
    load.add_argument("--duration", type=float, default=5.0, help="seconds measured per level")
    load.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    load.add_argument("--request-timeout", type=float, default=30.0)
    load.add_argument("--http-format", choices=("binary", "json"), default="binary")
    load.add_argument("--shared-memory", choices=("none", "system"), default="none")
    load.add_argument(
        "--streaming",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gRPC ModelStreamInfer (default: when the model is decoupled)",
    )
    load.add_argument(
        "--client",
        choices=CLIENTS,
        default="python",
        help="python (built in), wrk (HTTP) or h2load (gRPC) when installed",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write the results as JSON")
    out.add_argument("--csv", type=Path, help="write one CSV row per concurrency level")
    out.add_argument(
        "--plot",
        type=Path,
        help="PNG of latency against throughput (default with --json and a sweep)",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        model=args.model,
        url=args.url,
        protocol=args.protocol,
        version=args.model_version,
        inputs=tuple(args.input),
        input_data=args.input_data,
        payload_bytes=args.bytes,
        concurrency=args.concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup,
        binary=args.http_format == "binary",
        shared_memory=args.shared_memory == "system",
        streaming=args.streaming,
        client=args.client,
        request_timeout_s=args.request_timeout,
    )


def run_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on uvloop when it is installed (a lighter client), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    result: T = uvloop.run(coroutine)
    return result


def write_outputs(args: argparse.Namespace, config: RunConfig, results: list[CellResult]) -> None:
    meta = {
        "model": config.model,
        "protocol": config.protocol,
        "client": config.client,
        "url": "{}:{}".format(*config.address),
        "duration_s": config.duration_s,
        "warmup_s": config.warmup_s,
        "http_format": args.http_format,
        "shared_memory": args.shared_memory,
        "python": platform.python_version(),
    }
    if args.json:
        write_json(results, args.json, meta)
    if args.csv:
        write_csv(results, args.csv)
    picture = args.plot
    if picture is None and args.json and len(results) > 1:
        picture = args.json.with_suffix(".png")
    if picture is not None:
        title = f"{config.model} over {config.protocol} ({config.client} client)"
        print(plot(results, picture, title))


def main(args: argparse.Namespace) -> int:
    """Run ``shoal perf``: 0 when every request succeeded, 1 if some failed, 2 on a fatal error."""
    config = config_from_args(args)
    try:
        results = run_loop(run(config))
    except PerfError as error:
        print(f"shoal perf: {error}", file=sys.stderr)
        return 2
    print(format_table(results))
    write_outputs(args, config, results)
    return 1 if any(r.errors for r in results) else 0
