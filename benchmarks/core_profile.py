"""Where the core process's CPU goes per request, by function (``perf`` samples).

    .venv/bin/python -m benchmarks.core_profile [--requests 8000] [--frontend-workers 2]

Starts ``shoal serve --frontend-workers N``, warms up, drives ``--requests`` HTTP requests to
``identity_fp32`` (64 B) from a few client threads with ``perf record -e cpu-clock`` on the core
process, and prints the core's CPU µs per request (from ``/proc``) split over the functions that
spent it themselves. A compiled build shows mypyc's functions by name (``CPyDef_...``); an
interpreted one shows CPython's evaluation loop instead. (callgrind would count instructions, a
figure load cannot move, but valgrind 3.19 has no ``pidfd_open``, which the core needs; this
machine's perf has no hardware counters either: samples of CPU time are what is left.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

import shoal._compiled
from benchmarks.batching import machine, stop_server
from benchmarks.overhead import start_traced_server

_THREADS = 4


def _drive(url: str, requests: int) -> None:
    """``requests`` requests to identity_fp32, from a few threads with a client each."""
    data = np.arange(16, dtype=np.float32)

    def loop(count: int) -> None:
        client = httpclient.InferenceServerClient(url)
        inputs = [httpclient.InferInput("INPUT0", [16], "FP32")]
        inputs[0].set_data_from_numpy(data)
        for _ in range(count):
            client.infer("identity_fp32", inputs)
        client.close()

    threads = [threading.Thread(target=loop, args=(requests // _THREADS,)) for _ in range(_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(data: str) -> list[tuple[float, str]]:
    """(share of the samples, "library: function") of each function, most first."""
    text = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "dso,symbol"],
        check=True,
        capture_output=True,
    ).stdout.decode(errors="replace")
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith("%") and parts[2].startswith("["):
            symbol = " ".join(parts[3:]).removesuffix(" - -")
            rows.append((float(parts[0][:-1]) / 100, f"{parts[1]}: {symbol}"))
    return rows


def _profile(pid: int, data: str, url: str, requests: int) -> float:
    """Drive ``requests`` requests with ``perf record`` on ``pid``; the CPU seconds it spent."""
    record = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-p", str(pid), "-o", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        before = _cpu_seconds(pid)
        _drive(url, requests)
        return _cpu_seconds(pid) - before
    finally:
        record.send_signal(signal.SIGINT)
        record.wait(60)


def core_arguments(doc: str, requests: int) -> argparse.ArgumentParser:
    """The options every served-core benchmark takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--frontend-workers", type=int, default=2)
    return parser


@contextlib.contextmanager
def warm_core(log: Path, frontend_workers: int, **options: Any) -> Iterator[Any]:
    """``shoal serve`` on benchmarks/models, warmed up (first-use paths do not count), stopped
    on leaving."""
    server = start_traced_server(log, frontend_workers, trace=False, **options)
    try:
        _drive(server.http, 400)
        yield server
    finally:
        stop_server(server.process)


def main() -> None:
    parser = core_arguments(__doc__, 8000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with warm_core(Path(tmp) / "serve.log", args.frontend_workers) as server:
            cpu = _profile(server.process.pid, f"{tmp}/perf.data", server.http, args.requests)
        rows = _report(f"{tmp}/perf.data")
    per = cpu / args.requests * 1e6
    print(f"# core process, --frontend-workers {args.frontend_workers}, {args.requests} HTTP")
    print(f"# requests from {_THREADS} threads, hot path {shoal._compiled.state}, {machine()}")
    print(f"\ncore CPU per request: {per:.1f} µs\n")
    libraries: dict[str, float] = {}
    for share, name in rows:
        library = name.split(": ", 1)[0]
        libraries[library] = libraries.get(library, 0.0) + share
    print("| library | µs/req | share |\n|---|---:|---:|")
    for library, share in sorted(libraries.items(), key=lambda item: -item[1])[:8]:
        print(f"| `{library}` | {share * per:.2f} | {share:.1%} |")
    print("\n| function (self) | µs/req | share |\n|---|---:|---:|")
    for share, name in rows[: args.top]:
        print(f"| `{name[-100:]}` | {share * per:.2f} | {share:.1%} |")


if __name__ == "__main__":
    main()
