"""Where a c=1 request's time goes, hop by hop, and how many times each process sleeps for it.

    .venv/bin/python -m benchmarks.c1_hops                       # workers 1 and 2, HTTP and gRPC
    .venv/bin/python -m benchmarks.c1_hops --busy-poll 0,100 --duration 3
    .venv/bin/python -m benchmarks.c1_hops --workers 7 --instances 8 -c 64 --untraced  # CPU, loaded

A request at c=1 with frontend workers crosses client -> worker -> core -> stub -> core ->
worker -> client; each hop that finds its process asleep costs a wake-up. For each
``--frontend-workers`` count, ``--busy-poll-us`` value and protocol this starts
``shoal serve --trace-overhead`` on ``benchmarks/models`` (identity_fp32, 64 B) and drives it
with one connection of a native client (``wrk`` for HTTP, ``h2load`` for gRPC; the Python one
where they are missing). It prints:

* the client's p50 / p99 latency;
* the core's stages (``--trace-overhead``, docs/perf.md): ``ipc_in`` (the Execute's send to the
  stub starting the batch: the core -> stub hop), ``compute`` (the stub's work), ``ipc_out``
  (the stub's Result to the core reading it: the stub -> core hop), ``complete`` (the core's
  answer), and ``outside`` (the client's mean minus the core's total: the client, the sockets,
  the worker and the core <-> worker hops);
* per request, the CPU (µs) and the voluntary context switches (the sleeps: each one is a
  wake-up later) of the core, the workers and the stubs, from ``/proc``; these do not depend on
  how loaded the machine is, the latencies do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.batching import machine, stop_server
from benchmarks.overhead import ROOT, cpu_seconds, stage_totals, start_traced_server
from shoal.perf import RunConfig, run
from shoal.perf.cli import run_loop

MODEL = "identity_fp32"
KINDS = ("core", "workers", "stubs")


def context_switches(core_pid: int) -> dict[str, int]:
    """Voluntary context switches so far (every thread) of the core, its workers, its stubs."""
    totals = {"core": _switches(core_pid), "workers": 0, "stubs": 0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == core_pid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            if parent != core_pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                kind = "workers" if b"worker_main" in cmdline.read() else "stubs"
            totals[kind] += _switches(int(entry))
        except OSError:
            continue
    return totals


def _switches(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            continue  # a thread that exited meanwhile
    return total


def _client(protocol: str) -> str:
    native = "wrk" if protocol == "http" else "h2load"
    return native if shutil.which(native) else "python"


def measure(server, protocol: str, duration: float, concurrency: int = 1) -> dict[str, float]:
    """One run against a started server (c=1 unless told): the row's figures."""
    url = server.http if protocol == "http" else server.grpc
    before = stage_totals(server.metrics_port, MODEL)
    cpu_before, sw_before = cpu_seconds(server.process.pid), context_switches(server.process.pid)
    config = RunConfig(
        model=MODEL,
        url=url,
        protocol=protocol,
        payload_bytes=64,
        concurrency=(concurrency,),
        duration_s=duration,
        warmup_s=0.5,
        client=_client(protocol),
    )
    (result,) = run_loop(run(config))
    cpu_after, sw_after = cpu_seconds(server.process.pid), context_switches(server.process.pid)
    after = stage_totals(server.metrics_port, MODEL)
    done = after["requests"][0] - before["requests"][0]  # the warm-up's too, as the CPU is

    def stage(name: str) -> float:
        n = after[name][0] - before[name][0]
        return (after[name][1] - before[name][1]) / n if n else 0.0

    row = {
        "p50": result.latency_ms.p50 * 1000,
        "p99": result.latency_ms.p99 * 1000,
        "ipc_in": stage("ipc_in"),
        "compute": stage("compute_input") + stage("compute_infer") + stage("compute_output"),
        "ipc_out": stage("ipc_out"),
        "complete": stage("complete"),
        "outside": result.latency_ms.mean * 1000 - stage("core_total"),
    }
    for kind in KINDS:
        row[f"{kind} µs"] = (cpu_after[kind] - cpu_before[kind]) * 1e6 / done if done else 0.0
        row[f"{kind} sw"] = (sw_after[kind] - sw_before[kind]) / done if done else 0.0
    return row


COLUMNS = ("p50", "p99", "ipc_in", "compute", "ipc_out", "complete", "outside")


def repository(root: Path, instances: int) -> Path:
    """``benchmarks/models`` with ``identity_fp32`` at ``instances`` instances, in ``root``:
    with one, a loaded server's limit is that one stub (the device's cells use eight)."""
    models = root / "models"
    shutil.copytree(ROOT / "benchmarks" / "models", models)
    config = models / MODEL / "config.pbtxt"
    text = config.read_text()
    group = "instance_group [ { count: 1 kind: KIND_CPU } ]"
    if group not in text:
        raise SystemExit(f"{config}: no '{group}' line to change")
    config.write_text(text.replace(group, group.replace("count: 1", f"count: {instances}")))
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="--frontend-workers counts")
    parser.add_argument(
        "--busy-poll", default="", help="--busy-poll-us values, e.g. 0,100 ('' leaves it out)"
    )
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument(
        "-c", "--concurrency", type=int, default=1, help="1 unless the sleeps under load matter"
    )
    parser.add_argument("--instances", type=int, default=1, help=f"{MODEL}'s instance count")
    parser.add_argument(
        "--untraced",
        action="store_true",
        help="no --trace-overhead: requests go straight from the workers to the stubs (direct "
        "dispatch, as served), the core's stage columns stay 0; for the CPU per process kind",
    )
    args = parser.parse_args(argv)
    polls = args.busy_poll.split(",") if args.busy_poll else [""]
    print(f"# c={args.concurrency}, {MODEL} 64 B x{args.instances} instances, {machine()}\n")
    stats = [f"{kind} {what}" for kind in KINDS for what in ("µs", "sw")]
    print("| workers | busy poll | protocol | " + " | ".join((*COLUMNS, *stats)) + " |")
    print("|---|---|---|" + "---:|" * (len(COLUMNS) + len(stats)))
    with tempfile.TemporaryDirectory(prefix="shoal-c1-") as tmp:
        models = repository(Path(tmp), args.instances)
        for workers in (int(w) for w in args.workers.split(",")):
            for poll in polls:
                extra = ["--busy-poll-us", poll] if poll else []
                server = start_traced_server(
                    Path(tmp) / "shoal.log",
                    workers,
                    extra=extra,
                    repository=models,
                    trace=not args.untraced,
                )
                try:
                    for protocol in args.protocols.split(","):
                        row = measure(server, protocol, args.duration, args.concurrency)
                        cells = [f"{row[c]:.0f}" for c in COLUMNS]
                        cells += [f"{row[s]:.{2 if s.endswith('sw') else 0}f}" for s in stats]
                        print(f"| {workers} | {poll or '-'} | {protocol} | {' | '.join(cells)} |")
                finally:
                    stop_server(server.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
