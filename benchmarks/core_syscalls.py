"""The core process's system calls per request (``strace -c``), by call.

    .venv/bin/python -m benchmarks.core_syscalls [--requests 2000] [--frontend-workers 2]

Starts ``shoal serve --frontend-workers N``, warms up, then counts the system calls of the core
process (its main thread: the loop) with ``strace -c`` while ``--requests`` HTTP requests go to
``identity_fp32`` (64 B) from a few client threads (``benchmarks.core_profile``'s driver), and
prints each call's count per request. Counts, unlike CPU time, hold still on a busy machine
(within the noise of how many requests share a loop turn). ``getpid`` is CPython's
``asyncio.get_running_loop()``; ``epoll_pwait`` a loop turn; ``read``/``write`` sockets and
doorbells.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

import shoal._compiled
from benchmarks.batching import machine
from benchmarks.core_profile import _THREADS, _drive, core_arguments, warm_core


def _counts(path: str) -> dict[str, int]:
    """Calls by system call, from ``strace -c``'s table."""
    counts: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


def _traced(pid: int, out: str, url: str, requests: int) -> dict[str, int]:
    """Drive ``requests`` requests with ``strace -c`` on ``pid``'s main thread."""
    strace = subprocess.Popen(
        ["strace", "-c", "-o", out, "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _drive(url, 40)  # strace is attached once a first request has gone through it
        _drive(url, requests)
    finally:
        strace.send_signal(signal.SIGINT)
        strace.wait(60)
    return _counts(out)


def main() -> None:
    args = core_arguments(__doc__, 2000).parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        warm_core(Path(tmp) / "serve.log", args.frontend_workers) as server,
    ):
        counts = _traced(server.process.pid, f"{tmp}/strace.txt", server.http, args.requests)
    total = args.requests + 40
    print(f"# core process, --frontend-workers {args.frontend_workers}, {total} HTTP requests")
    print(f"# from {_THREADS} threads, hot path {shoal._compiled.state}, {machine()}\n")
    print("| system call | per request |\n|---|---:|")
    for name, calls in sorted(counts.items(), key=lambda item: -item[1]):
        if calls / total >= 0.01:
            print(f"| `{name}` | {calls / total:.2f} |")
    print(f"| all | {sum(counts.values()) / total:.2f} |")


if __name__ == "__main__":
    main()
