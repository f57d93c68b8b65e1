"""Instructions a served frontend worker spends per request, counted by callgrind: exact where
this machine's timings move ±20 % (its VM has no hardware counters for ``perf stat``).

    .venv/bin/python -m benchmarks.worker_instructions [--protocol http|grpc] [--requests 2000]
        [--tree DIR] [--out DIR]

Serves the ``identity_fp32`` model of ``benchmarks/models`` with ``--frontend-workers 2``
(direct dispatch on: the real path of a plain request on a many-core machine), the two
workers under ``valgrind --tool=callgrind`` with instrumentation off until the server is up and
warm; then zeroes the counts, drives ``--requests`` 64-byte requests from one keep-alive
``tritonclient`` connection (so one worker serves them all), dumps, and prints each worker's
instructions per request. The core and the stub run natively. ``--out`` keeps the dumps for
``callgrind_annotate --inclusive=yes``.

Two things are bent for valgrind, and only here: valgrind 3.19 does not know ``pidfd_open``,
so the workers get a pipe that never becomes readable instead (a stub's exit goes unseen,
which this run does not need), and the core waits 15 minutes, not 60 s, for slow workers.
Compare two trees with ``--tree`` (each built in place: a tree whose hot path does not import
compiled is refused).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

_MODELS = Path(__file__).resolve().parent / "models"

#: The worker under callgrind, with the stand-in for ``os.pidfd_open``.
_WORKER = """
import os
_kept = []
def _never_readable(pid, flags=0):
    read, write = os.pipe()
    _kept.append(write)
    return read
os.pidfd_open = _never_readable
import sys
from shoal.server import worker_main
sys.exit(worker_main(sys.argv[1:]))
"""

#: What the core runs as ``sys.executable``: the workers under callgrind, the stubs as they are.
_LAUNCHER = """#!/bin/sh
case "$*" in
  *worker_main*) shift 2; exec valgrind --tool=callgrind --instr-atstart=no \\
      --callgrind-out-file="{out}/worker.%p" {python} -c '{worker}' "$@" ;;
esac
exec {python} "$@"
"""

#: The core: ``sys.executable`` pointed at the launcher, a longer wait for the workers.
_CORE = """
import sys
sys.executable = {launcher!r}
import shoal.frontends.workers.pool as pool
pool.WorkerPool.start.__defaults__ = (900.0,)
from shoal.cli import main
sys.argv = ["shoal", *{argv!r}]
sys.exit(main())
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5):
                return
        except OSError:
            time.sleep(0.5)  # polling a server that is starting under valgrind
    raise TimeoutError(f"the server was not ready within {deadline_s:.0f} s")


def _drive(protocol: str, url: str, requests: int) -> None:
    """``requests`` identity calls of 16 FP32 values, binary both ways, one connection."""
    data = np.arange(16, dtype=np.float32)
    if protocol == "http":
        import tritonclient.http as client
    else:
        import tritonclient.grpc as client  # type: ignore[no-redef]
    binary = {"binary_data": True} if protocol == "http" else {}
    triton = client.InferenceServerClient(url)
    tensor = client.InferInput("INPUT0", [16], "FP32")
    tensor.set_data_from_numpy(data, **binary)
    outputs = [client.InferRequestedOutput("OUTPUT0", **binary)]
    result = None
    for _ in range(requests):
        result = triton.infer("identity_fp32", [tensor], outputs=outputs)
    assert result is not None and (result.as_numpy("OUTPUT0") == data).all()
    triton.close()


def _callgrind(command: list[str], pids: list[int]) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", *command, str(pid)], check=True, capture_output=True)


def _totals(out: Path) -> dict[int, int]:
    """Each worker's instructions in its dump after the zeroing (``worker.<pid>.1``)."""
    totals: dict[int, int] = {}
    for dump in out.glob("worker.*.1"):
        text = dump.read_text(errors="replace")
        found = re.search(r"^totals:\s+(\d+)", text, re.MULTILINE) or re.search(
            r"^summary:\s+(\d+)", text, re.MULTILINE
        )
        if found:
            totals[int(dump.name.split(".")[1])] = int(found.group(1))
    return totals


def run(protocol: str, requests: int, tree: Path, out: Path) -> dict[int, int]:
    """Each worker's instructions over ``requests`` requests (the busy one has them all)."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    repository = out / "repository"
    repository.mkdir()
    (repository / "identity_fp32").symlink_to(_MODELS / "identity_fp32")
    launcher = out / "python"
    launcher.write_text(
        _LAUNCHER.format(out=out, python=sys.executable, worker=_WORKER.replace("'", '"'))
    )
    launcher.chmod(0o755)
    argv = [
        "serve",
        *("--model-repository", str(repository), "--frontend-workers", "2"),
        *("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree), "OPENBLAS_NUM_THREADS": "1"}
    compiled = subprocess.run(
        [sys.executable, "-m", "shoal.check_compiled"], env=env, cwd=tree, capture_output=True
    )
    if compiled.returncode != 0:
        raise SystemExit(f"{tree}: {compiled.stdout.decode().strip()}")
    core_code = _CORE.format(launcher=str(launcher), argv=argv)
    log = (out / "serve.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-c", core_code],
        env=env,
        cwd=tree,  # ``-c`` puts the working directory first on the path
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_ready(http, 900.0)
        url = f"127.0.0.1:{http if protocol == 'http' else grpc}"
        _drive(protocol, url, 200)  # routes granted, caches warm
        found = subprocess.run(
            ["pgrep", "-f", f"callgrind-out-file={out}"], capture_output=True, text=True
        )
        workers = [int(pid) for pid in found.stdout.split()]
        return _measure(protocol, url, requests, workers, out)
    finally:
        server.terminate()
        server.wait(120)
        log.close()


def _measure(
    protocol: str, url: str, requests: int, workers: list[int], out: Path
) -> dict[int, int]:
    _callgrind(["-i", "on"], workers)
    _callgrind(["-z"], workers)
    _drive(protocol, url, requests)
    _callgrind(["-d"], workers)
    return _totals(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, default=None, help="keep the dumps here")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH")
    out = args.out or Path(tempfile.mkdtemp(prefix="shoal-worker-cg-"))
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        sys.exit(f"{out} is not empty: its dumps would mix with this run's")
    totals = run(args.protocol, args.requests, args.tree.resolve(), out.resolve())
    for pid, total in sorted(totals.items(), key=lambda item: -item[1]):
        print(
            f"{args.protocol} 64 B, worker {pid}: {total:,} instructions, "
            f"{total / args.requests:,.0f} per request over {args.requests}"
        )
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
