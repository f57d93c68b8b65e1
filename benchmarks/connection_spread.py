"""How a burst of new connections spreads over the frontend workers.

    .venv/bin/python -m benchmarks.connection_spread [--workers 4] [--connections 16]
        [--tries 5] [--tree DIR ...]

Starts ``shoal serve --frontend-workers N`` (no model loaded), opens ``--connections`` keep-alive
connections at once as a load generator does at its start (non-blocking connects in a loop,
alternately to the HTTP and the gRPC port), answers each once (an HTTP health check; an HTTP/2
preface and SETTINGS), then reads which worker holds each connection from ``/proc`` and prints
the counts per worker, most loaded first, for each try. With ``--tree`` each tree's shoal is run
in turn (``PYTHONPATH``), so two versions are compared in one run. The figure that matters is
the busiest worker's share: its core caps the server when every connection is busy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.integration.server import holder, tcp_sockets

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _workers(core: int) -> list[int]:
    with open(f"/proc/{core}/task/{core}/children") as children:
        return [int(pid) for pid in children.read().split() if _is_worker(int(pid))]


def _is_worker(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"worker_main" in cmdline.read()
    return False


def _burst(ports: tuple[int, int], count: int) -> list[socket.socket]:
    opened = []
    for index in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", ports[index % 2]))
        opened.append(sock)
    for index, sock in enumerate(opened):
        sock.setblocking(True)
        sock.settimeout(30)
        if index % 2 == 0:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        else:
            sock.sendall(_PREFACE)
        sock.recv(4096)  # answered: the worker that serves it holds it
    return opened


def _spread(tree: str, workers: int, connections: int, tries: int) -> list[list[int]]:
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    env = dict(os.environ, PYTHONPATH=tree)
    args = [sys.executable, "-m", "shoal", "serve", "--model-repository", tempfile.mkdtemp()]
    args += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    args += ["--frontend-workers", str(workers), "--model-control-mode", "explicit"]
    args += ["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]
    proc = subprocess.Popen(
        args, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            ready = f"http://127.0.0.1:{http}/v2/health/ready"
            with contextlib.suppress(OSError), urllib.request.urlopen(ready) as answer:
                if answer.status == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{tree}: shoal did not start")
            time.sleep(0.1)  # polling the health endpoint
        pids = _workers(proc.pid)
        results = []
        for _ in range(tries):
            opened = _burst((http, grpc), connections)
            try:
                ends = [tcp_sockets(remote_port=sock.getsockname()[1]) for sock in opened]
                holders = [holder(pids, end) for end in ends]
            finally:
                for sock in opened:
                    sock.close()
            results.append(sorted((holders.count(pid) for pid in pids), reverse=True))
            time.sleep(0.2)  # the workers close their ends before the next burst
        return results
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[])
    args = parser.parse_args()
    trees = args.tree or [str(Path(__file__).resolve().parents[1])]
    print(f"{args.connections} connections over {args.workers} workers, {os.cpu_count()} cores")
    for tree in trees:
        spreads = _spread(tree, args.workers, args.connections, args.tries)
        busiest = max(spread[0] for spread in spreads)
        shown = "  ".join("/".join(map(str, spread)) for spread in spreads)
        fair = -(-args.connections // args.workers)
        print(f"{tree}: {shown}   busiest {busiest} (fair {fair})")


if __name__ == "__main__":
    main()
