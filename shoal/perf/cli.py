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
from shoal.perf.sweep import parse_concurrency, parse_concurrency_range
from shoal.perf.tensors import parse_input_spec

T = TypeVar("T")


def _argument(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def _input_data(text: str) -> str | Path:
    """perf_analyzer's ``--input-data``: ``random``, ``zero`` or a JSON file."""
    return text if text in ("random", "zero") else Path(text)


def _add_target(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument(
        "--url", "-u", default="", help="host:port (default: 127.0.0.1:8000, or :8001 for gRPC)"
    )
    target.add_argument(
        "--protocol",
        "-i",
        type=str.lower,
        choices=PROTOCOLS,
        default="http",
        help="the protocol to load the server with",
    )
    target.add_argument("--model", "--model-name", "-m", required=True, help="the model to load")
    target.add_argument(
        "--model-version",
        "-x",
        default="",
        help="the version to load (default: the server's choice)",
    )


def _add_inputs(parser: argparse.ArgumentParser) -> None:
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
    data.add_argument(
        "--input-data",
        type=_input_data,
        default="random",
        metavar="random|zero|FILE",
        help="random or zero data of the metadata's shapes, or a JSON file: perf_analyzer's "
        '{"data": [{...}]} (its first entry) or a V2 request body',
    )
    data.add_argument(
        "--batch-size",
        "-b",
        type=int,
        default=1,
        help="the batch dimension of the requests to a batched model",
    )


def _add_load(parser: argparse.ArgumentParser) -> None:
    load = parser.add_argument_group("load")
    _add_levels(load)
    _add_span(load)
    _add_transport(load)


def _add_levels(load: argparse._ArgumentGroup) -> None:
    """How many requests are in flight: one level or a sweep."""
    levels = load.add_mutually_exclusive_group()
    levels.add_argument(
        "--concurrency",
        "-c",
        type=_argument(parse_concurrency),
        default=(1,),
        metavar="LEVELS",
        help="one level or a sweep: 8, 1,8,64 or 1:64 (doubling) (default: 1)",
    )
    levels.add_argument(
        "--concurrency-range",
        dest="concurrency",
        type=_argument(parse_concurrency_range),
        metavar="START:END:STEP",
        help="perf_analyzer's sweep: START to END by STEP (1:8:2 is 1, 3, 5, 7)",
    )


def _add_span(load: argparse._ArgumentGroup) -> None:
    """How long each level is measured, after how long a warmup."""
    span = load.add_mutually_exclusive_group()
    span.add_argument("--duration", type=float, default=5.0, help="seconds measured per level")
    span.add_argument(
        "--measurement-interval",
        "-p",
        dest="duration",
        type=lambda text: float(text) / 1000,
        metavar="MS",
        help="perf_analyzer's name: milliseconds measured per level (default: 5000)",
    )
    load.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    load.add_argument(
        "--request-timeout", type=float, default=30.0, help="seconds before a request fails"
    )


def _add_transport(load: argparse._ArgumentGroup) -> None:
    """How requests travel: their encoding, shared memory, streaming and the client."""
    load.add_argument(
        "--http-format",
        choices=("binary", "json"),
        default="binary",
        help="tensor data as the binary extension or as JSON",
    )
    load.add_argument(
        "--shared-memory",
        choices=("none", "system", "cuda"),
        default="none",
        help="pass inputs and outputs through system shared memory registered with the server "
        "(cuda: use perf_analyzer)",
    )
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """shoal perf's flags; perf_analyzer's names (-m, -u, -i, -b, --concurrency-range,
    --measurement-interval, --input-data, --shared-memory, -f) are accepted beside them."""
    _add_target(parser)
    _add_inputs(parser)
    _add_load(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, help="write the results as JSON")
    out.add_argument(
        "--csv", "-f", type=Path, help="write one CSV row per concurrency level to this file"
    )
    out.add_argument(
        "--plot",
        type=Path,
        help="PNG of latency against throughput (default with --json and a sweep)",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    if args.shared_memory == "cuda":
        raise PerfError(
            "--shared-memory cuda is not built into shoal perf: use perf_analyzer "
            "(docs/perf.md), which shoal serves unmodified"
        )
    input_data = args.input_data
    return RunConfig(
        model=args.model,
        url=args.url,
        protocol=args.protocol,
        version=args.model_version,
        inputs=tuple(args.input),
        input_data=input_data if isinstance(input_data, Path) else None,
        zero_data=input_data == "zero",
        batch_size=args.batch_size,
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
    picture = _plot_path(args, results)
    if picture is not None:
        title = f"{config.model} over {config.protocol} ({config.client} client)"
        print(plot(results, picture, title))


def _plot_path(args: argparse.Namespace, results: list[CellResult]) -> Path | None:
    """``--plot``, else a PNG beside the JSON output of a sweep."""
    if args.plot is None and args.json and len(results) > 1:
        return Path(args.json.with_suffix(".png"))
    return Path(args.plot) if args.plot is not None else None


def main(args: argparse.Namespace) -> int:
    """Run ``shoal perf``: 0 when every request succeeded, 1 if some failed, 2 on a fatal error."""
    try:
        config = config_from_args(args)
        results = run_loop(run(config))
    except PerfError as error:
        print(f"shoal perf: {error}", file=sys.stderr)
        return 2
    print(format_table(results))
    write_outputs(args, config, results)
    return 1 if any(r.errors for r in results) else 0
