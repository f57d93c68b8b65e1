"""Where a request's time goes inside shoal: the per-stage breakdown of ``--trace-overhead``.

    .venv/bin/python -m benchmarks.overhead              # identity_fp32, HTTP, c=1 and 8
    .venv/bin/python -m benchmarks.overhead --model add_sub --protocol grpc -c 8

It starts ``shoal serve --trace-overhead`` on ``benchmarks/models``, drives one model with
``shoal.perf``'s closed-loop client, and reads the ``shoal_request_stage_*`` counters before and
after each cell. Stages, in a request's order (docs/perf.md defines each):

* ``stage``: checks and the copy of the inputs into the input arena;
* ``queue``: in the scheduler's queue (a request sent ahead waits in the stub's ring instead);
* ``ipc_in``: from the Execute message's send to the stub starting the batch;
* ``compute_input`` / ``compute_infer`` / ``compute_output``: inside the stub, as Triton's
  statistics define them (building requests; ``execute``; writing outputs);
* ``ipc_out``: from the stub's Result to the supervisor reading it;
* ``complete``: from there to the response returned to the frontend.

``core_total`` is the whole (it also holds what falls between stages). ``outside the core`` is
the client's mean latency minus ``core_total``: the frontend (HTTP or gRPC parsing and
serialisation), the sockets and the client itself.

The CPU rows are what each kind of process spent per request (from ``/proc``): the core process
(with ``--frontend-workers 1`` it also runs the frontends), the frontend workers
(``--frontend-workers N``) and the stubs.

    .venv/bin/python -m benchmarks.overhead --frontend-workers 2 --protocol grpc -c 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.batching import START_TIMEOUT_S, machine, server_ready, stop_server
from shoal.perf import RunConfig, run
from shoal.perf.cli import run_loop

ROOT = Path(__file__).resolve().parents[1]
STAGES = (
    "stage",
    "queue",
    "ipc_in",
    "compute_input",
    "compute_infer",
    "compute_output",
    "ipc_out",
    "complete",
    "core_total",
)


@dataclass(frozen=True)
class TracedServer:
    process: subprocess.Popen[bytes]
    http: str  # host:port
    grpc: str
    metrics_port: str


def start_traced_server(
    log_path: Path,
    frontend_workers: int = 1,
    *,
    wrapper: Sequence[str] = (),
    trace: bool = True,
    timeout: float = START_TIMEOUT_S,
    extra: Sequence[str] = (),
    repository: Path = ROOT / "benchmarks" / "models",
) -> TracedServer:
    """``shoal serve --trace-overhead`` with HTTP, gRPC and metrics on free loopback ports;
    ``wrapper``: a command it runs under (``valgrind ...``), ``trace``: the flag given,
    ``extra``: more flags (``--busy-poll-us 0``), ``repository``: ``benchmarks/models`` unless
    told."""
    command = [
        *wrapper,
        sys.executable,
        *("-m", "shoal.cli", "serve", "--model-repository", str(repository)),
        *("--http-address", "127.0.0.1", "--http-port", "0"),
        *("--grpc-address", "127.0.0.1", "--grpc-port", "0"),
        *("--metrics-address", "127.0.0.1", "--metrics-port", "0"),
        *("--frontend-workers", str(frontend_workers)),
        *(["--trace-overhead"] if trace else []),
        *extra,
    ]
    log = log_path.open("wb")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
    assert process.stdout is not None
    ports: dict[str, str] = {}
    for raw in process.stdout:
        parts = raw.decode(errors="replace").split()
        if parts[:1] == ["SHOAL_LISTENING"] and len(parts) >= 4:
            ports[parts[1]] = parts[3]
        if {"http", "grpc", "metrics"} <= ports.keys():
            break
    else:
        raise RuntimeError(f"shoal serve exited with {process.wait()} before listening")
    # Keep draining stdout, so a chatty server never blocks on a full pipe.
    threading.Thread(target=shutil.copyfileobj, args=(process.stdout, log), daemon=True).start()
    server = TracedServer(
        process, f"127.0.0.1:{ports['http']}", f"127.0.0.1:{ports['grpc']}", ports["metrics"]
    )
    deadline = time.monotonic() + timeout
    while not server_ready(server.http):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError(f"shoal serve did not become ready (log: {log_path})")
        time.sleep(0.2)  # polling the readiness of a server we started
    return server


def stage_totals(metrics_port: str, model: str) -> dict[str, tuple[float, float]]:
    """stage -> (count, total µs) for ``model`` from ``/metrics``."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    counts: dict[str, float] = {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            stage = sample.labels.get("stage")
            if family.name == "shoal_request_stage_count":
                counts[stage] = sample.value
            elif family.name == "shoal_request_stage_duration_us":
                totals[stage] = sample.value
            elif family.name == "nv_inference_request_success":
                counts["requests"] = sample.value
    found = {stage: (counts.get(stage, 0.0), totals.get(stage, 0.0)) for stage in STAGES}
    # every request answered: the stages count only those that passed through the core (a
    # request a worker sent straight to a stub has none: --direct-dispatch)
    found["requests"] = (counts.get("requests", 0.0), 0.0)
    return found


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(core_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of the core, its frontend workers and its stubs."""
    totals = {"core": _cpu(core_pid), "workers": 0.0, "stubs": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != core_pid:  # the parent pid
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read()
        except OSError:
            continue
        kind = "workers" if b"worker_main" in args else "stubs"
        totals[kind] += (int(fields[11]) + int(fields[12])) / _TICK
    return totals


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="identity_fp32")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("-c", "--concurrency", default="1,8")
    parser.add_argument("--bytes", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--frontend-workers", type=int, default=1)
    parser.add_argument(
        "--server-args", default="", help="more serve flags, one string: '--busy-poll-us 0'"
    )
    parser.add_argument(
        "--no-stages",
        action="store_true",
        help="serve without --trace-overhead (its stages then read 0): the CPU rows of a "
        "server whose workers send requests straight to the stubs (--direct-dispatch, which "
        "--trace-overhead turns off)",
    )
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="shoal-overhead-") as tmp:
        server = start_traced_server(
            Path(tmp) / "shoal.log",
            args.frontend_workers,
            trace=not args.no_stages,
            extra=args.server_args.split(),
        )
        url = server.http if args.protocol == "http" else server.grpc
        try:
            print(
                f"# {args.model} over {args.protocol}, {args.bytes} B, "
                f"--frontend-workers {args.frontend_workers}, {machine()}\n"
            )
            header = "| stage | " + " | ".join(f"c={level} µs" for level in levels) + " |"
            columns: list[dict[str, float]] = []
            for level in levels:
                before = stage_totals(server.metrics_port, args.model)
                cpu_before = cpu_seconds(server.process.pid)
                config = RunConfig(
                    model=args.model,
                    url=url,
                    protocol=args.protocol,
                    payload_bytes=args.bytes,
                    concurrency=(level,),
                    duration_s=args.duration,
                    warmup_s=1.0,
                )
                (result,) = run_loop(run(config))
                cpu_after = cpu_seconds(server.process.pid)
                after = stage_totals(server.metrics_port, args.model)
                column = {}
                for stage in STAGES:
                    n = after[stage][0] - before[stage][0]
                    column[stage] = (after[stage][1] - before[stage][1]) / n if n else 0.0
                column["client mean latency"] = result.latency_ms.mean * 1000
                column["outside the core"] = column["client mean latency"] - column["core_total"]
                column["infer/s"] = result.throughput
                # the warm-up's requests count too: the CPU counters cannot tell them apart
                done = after["requests"][0] - before["requests"][0]
                for kind in ("core", "workers", "stubs"):
                    spent = cpu_after[kind] - cpu_before[kind]
                    column[f"{kind} CPU µs/req"] = spent * 1e6 / done if done else 0.0
                columns.append(column)
            print(header)
            print("|---|" + "---:|" * len(levels))
            rows = [*STAGES, "outside the core", "client mean latency", "infer/s"]
            rows += ["core CPU µs/req", "workers CPU µs/req", "stubs CPU µs/req"]
            for row in rows:
                cells = " | ".join(f"{column[row]:,.0f}" for column in columns)
                print(f"| {row} | {cells} |")
        finally:
            stop_server(server.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
