"""The core's eventfd rings (doorbell writes) per request, counted with strace.

    .venv/bin/python -m benchmarks.core_rings                    # c=8, 2 workers, HTTP (wrk)
    .venv/bin/python -m benchmarks.core_rings --server-args "--busy-poll-us 0"

strace slows the core, which makes it the slow side (as on a many-core machine, where it is the
wall): a stub that answered then often sleeps before the core reads its Result. Every 8-byte
write of 1 by the core is a doorbell: an Execute or Release to a sleeping stub, room in a ring.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.batching import stop_server
from benchmarks.overhead import stage_totals, start_traced_server
from shoal.perf import RunConfig, run
from shoal.perf.cli import run_loop

MODEL = "identity_fp32"
_RING = '"\\1\\0\\0\\0\\0\\0\\0\\0", 8)'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--frontend-workers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--server-args", default="", help="more serve flags, one string")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-rings-") as tmp:
        server = start_traced_server(
            Path(tmp) / "shoal.log", args.frontend_workers, extra=args.server_args.split()
        )
        try:
            trace = Path(tmp) / "strace.txt"
            before = stage_totals(server.metrics_port, MODEL)["core_total"][0]
            pid = str(server.process.pid)
            strace = subprocess.Popen(
                ["strace", "-f", "-qq", "-e", "trace=write", "-o", str(trace), "-p", pid]
            )
            time.sleep(0.5)  # strace attaches
            config = RunConfig(
                model=MODEL,
                url=server.http,
                protocol="http",
                payload_bytes=64,
                concurrency=(args.concurrency,),
                duration_s=args.duration,
                warmup_s=0.2,
                client="wrk",
            )
            run_loop(run(config))
            strace.send_signal(signal.SIGINT)
            strace.wait()
            done = stage_totals(server.metrics_port, MODEL)["core_total"][0] - before
            rings = sum(_RING in line for line in trace.read_text().splitlines())
            print(
                f"requests {done:.0f}, core eventfd rings {rings}, per request {rings / done:.3f}"
            )
        finally:
            stop_server(server.process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
