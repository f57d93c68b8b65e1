"""The frontend workers' CPU per request, gRPC beside HTTP, through ``--frontend-workers N``:
prints figures, asserts nothing.

It starts ``shoal serve --frontend-workers N --trace-overhead`` on ``benchmarks/models`` and
drives identity_fp32 with external load generators (``h2load`` for gRPC, ``wrk`` for HTTP, both
sending one pre-framed request: the tensor in ``raw_input_contents`` over gRPC, a binary
tensor over HTTP), alternating the protocols for ``--rounds`` rounds. Each cell prints the
workers' CPU µs per request (from ``/proc``; the warm-up's requests count too, as the
counters cannot tell them apart), the core's and the stubs', and the requests per second.
``--no-stages`` serves without ``--trace-overhead``: the workers then send plain requests
straight to the stubs (direct dispatch), as a server does by default.

    .venv/bin/python -m benchmarks.grpc_workers_cpu --bytes 4194304 -c 8 --rounds 3
    .venv/bin/python -m benchmarks.grpc_workers_cpu --bytes 64 -c 64 --rounds 2

h2load sends DATA frames of 16 KiB; ``--grpc-client python`` drives gRPC with ``shoal.perf``'s
built-in client instead (grpcio, as ``tritonclient.grpc``: frames up to the server's 1 MiB),
itself a heavier load on the machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.batching import machine, stop_server
from benchmarks.overhead import TracedServer, cpu_seconds, stage_totals, start_traced_server
from shoal.perf import RunConfig, run
from shoal.perf.cli import run_loop

_CLIENTS = {"grpc": "h2load", "http": "wrk"}
_MODEL = "identity_fp32"


def _cell(server: TracedServer, protocol: str, args: argparse.Namespace) -> dict[str, float]:
    """Drive one protocol once; CPU µs per request of each kind of process, and infer/s."""
    url = server.http if protocol == "http" else server.grpc
    before = stage_totals(server.metrics_port, _MODEL)["requests"][0]
    cpu_before = cpu_seconds(server.process.pid)
    config = RunConfig(
        model=_MODEL,
        url=url,
        protocol=protocol,
        payload_bytes=args.bytes,
        concurrency=(args.concurrency,),
        duration_s=args.duration,
        warmup_s=1.0,
        client=args.grpc_client if protocol == "grpc" else _CLIENTS[protocol],
    )
    (result,) = run_loop(run(config))
    cpu_after = cpu_seconds(server.process.pid)
    done = stage_totals(server.metrics_port, _MODEL)["requests"][0] - before
    cell = {"infer/s": result.throughput}
    for kind in ("workers", "core", "stubs"):
        spent = cpu_after[kind] - cpu_before[kind]
        cell[kind] = spent * 1e6 / done if done else 0.0
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frontend-workers", type=int, default=2)
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--grpc-client", choices=("h2load", "python"), default="h2load")
    parser.add_argument(
        "--no-stages",
        action="store_true",
        help="serve without --trace-overhead, so that the workers send plain requests straight "
        "to the stubs (--direct-dispatch, which --trace-overhead turns off)",
    )
    args = parser.parse_args(argv)
    protocols = args.protocols.split(",")
    with tempfile.TemporaryDirectory(prefix="shoal-grpc-workers-") as tmp:
        server = start_traced_server(
            Path(tmp) / "shoal.log", args.frontend_workers, trace=not args.no_stages
        )
        try:
            print(
                f"# {_MODEL} {args.bytes} B c={args.concurrency}, --frontend-workers "
                f"{args.frontend_workers}, {machine()}\n"
            )
            print("| round | protocol | workers µs/req | core µs/req | stubs µs/req | infer/s |")
            print("|---|---|---:|---:|---:|---:|")
            for index in range(args.rounds):
                for protocol in protocols:
                    cell = _cell(server, protocol, args)
                    print(
                        f"| {index + 1} | {protocol} | {cell['workers']:,.0f} | "
                        f"{cell['core']:,.0f} | {cell['stubs']:,.0f} | {cell['infer/s']:,.0f} |",
                        flush=True,
                    )
        finally:
            stop_server(server.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
