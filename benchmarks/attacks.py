"""The client-side attacks of issue #23, each against a fresh ``shoal serve``: what the server's
memory and its other clients pay.

    .venv/bin/python -m benchmarks.attacks                 # every attack
    .venv/bin/python -m benchmarks.attacks bodies ping     # some of them

For each attack: a fresh server with the bundled models (default flags), two probe clients that
send small ``identity`` requests one after the other (HTTP on one keep-alive connection, and
gRPC frames on one HTTP/2 connection), and a sampler of the supervisor's RSS every 20 ms. The
attack runs; then the line reports the peak RSS growth over the idle server, the slowest probe
answer during the attack (HTTP and gRPC), how the attack ended, and whether the server and its
stubs survived. Results go to docs/hardening.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hyperframe.frame import DataFrame, HeadersFrame, PingFrame, SettingsFrame

from tests.h2client import PREFACE, RawClient, grpc_frame, identity_request, request_headers
from tests.http1 import read_response
from tests.integration.server import BUNDLED, ShoalServer

MIB = 1 << 20


@dataclass
class Outcome:
    rss_growth: int = 0
    http_worst: float = 0.0
    grpc_worst: float = 0.0
    ended: str = ""
    survived: bool = True


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _connect(server: ShoalServer, timeout: float = 120) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)


class _Probe(threading.Thread):
    """Small identity requests one after the other; the slowest answer while running."""

    def __init__(self, server: ShoalServer, kind: str) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.kind = kind
        self.worst = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._http() if self.kind == "http" else self._grpc()
        except OSError:
            self.worst = float("inf")

    def _http(self) -> None:
        body = json.dumps(
            {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [1], "data": [1]}]}
        ).encode()
        head = (
            "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with _connect(self.server) as sock:
            while not self.stop.is_set():
                started = time.monotonic()
                sock.sendall(head + body)
                read_response(sock)
                self.worst = max(self.worst, time.monotonic() - started)
                time.sleep(0.005)

    def _grpc(self) -> None:
        message = grpc_frame(identity_request(np.arange(1, dtype=np.int32)))
        with RawClient(self.server.grpc_port, timeout=120) as raw:
            stream_id = 1
            while not self.stop.is_set():
                started = time.monotonic()
                raw.send(
                    HeadersFrame(
                        stream_id, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]
                    ),
                    DataFrame(stream_id, data=message, flags=["END_STREAM"]),
                )
                raw.read_stream(stream_id)
                self.worst = max(self.worst, time.monotonic() - started)
                stream_id += 2
                time.sleep(0.005)


# --- the attacks: each returns how it ended -------------------------------------------------------


def none(server: ShoalServer) -> str:
    """No attack: the probes alone for 3 s, the baseline of the figures."""
    time.sleep(3)
    return "3 s"


def bodies(server: ShoalServer) -> str:
    """30 connections announce 64 MiB - 1 bodies on a path the ASGI way reads and send 123 B."""
    sockets = []
    for _ in range(30):
        sock = _connect(server)
        head = (
            "POST /v2/models/identity/infer?x=1 HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {64 * MIB - 1}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"{" * 123)
        sockets.append(sock)
    time.sleep(2)
    for sock in sockets:
        sock.close()
    return "30 connections held 2 s"


def prefixes(server: ShoalServer) -> str:
    """Two gRPC streams announce 2^31 - 1 byte messages (58 bytes on the wire)."""
    with RawClient(server.grpc_port) as raw:
        for stream_id in (1, 3):
            raw.send(
                HeadersFrame(
                    stream_id, data=raw.block(request_headers(raw.port)), flags=["END_HEADERS"]
                ),
                DataFrame(stream_id, data=struct.pack(">BI", 0, 2**31 - 1) + b"\x0a" * 24),
            )
        time.sleep(2)
    return "held 2 s"


def _flood(server: ShoalServer, frame: bytes, seconds: float = 5.0) -> str:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(seconds)
    sock.connect(("127.0.0.1", server.grpc_port))
    batch = frame * 10_000
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        sock.sendall(PREFACE + SettingsFrame(0).serialize())
        while time.monotonic() < deadline:
            sock.sendall(batch)
            sent += len(batch)
    except (BrokenPipeError, ConnectionResetError):
        return f"cut off after {sent / MIB:.1f} MiB"
    except TimeoutError:
        return f"server stopped reading after {sent / MIB:.1f} MiB"
    finally:
        sock.close()
    return f"{sent / MIB:.0f} MiB sent in {seconds:.0f} s, never cut off"


def ping(server: ShoalServer) -> str:
    """PING frames from a client that never reads, for up to 5 s."""
    return _flood(server, PingFrame(0, opaque_data=b"12345678").serialize())


def settings(server: ShoalServer) -> str:
    """SETTINGS frames from a client that never reads, for up to 5 s."""
    return _flood(server, SettingsFrame(0).serialize())


def _grpc_call(server: ShoalServer, body: bytes, compressed: bool = False) -> str:
    with RawClient(server.grpc_port, timeout=300) as raw:
        extra = (("grpc-encoding", "gzip"),) if compressed else ()
        wire = grpc_frame(body, compressed)
        data = [DataFrame(1, data=wire[i : i + MIB]) for i in range(0, len(wire), MIB)]
        data[-1].flags.add("END_STREAM")
        started = time.monotonic()
        headers = raw.block(request_headers(raw.port, extra=extra))
        raw.send(HeadersFrame(1, data=headers, flags=["END_HEADERS"]), *data)
        response = raw.read_stream(1)
        took = time.monotonic() - started
    return f"grpc-status {response.status} after {took:.2f} s"


def zeros(server: ShoalServer) -> str:
    """A 4 MiB ModelInfer message of zero bytes."""
    return _grpc_call(server, bytes(4 * MIB))


def gzip16k(server: ShoalServer) -> str:
    """16 KiB of gzip that inflate to 16 MiB of zero bytes."""
    return _grpc_call(server, gzip.compress(bytes(16 * MIB)), compressed=True)


def gzip1m(server: ShoalServer) -> str:
    """1 MiB of gzip that inflate to 1 GiB of zero bytes."""
    return _grpc_call(server, gzip.compress(bytes(1024 * MIB)), compressed=True)


@functools.cache
def _json_request(model: str) -> bytes:
    """A 40 MB JSON infer request: made before the probes start (:data:`PREPARE`), since making
    it holds this process's GIL for a while and would stall the probes' threads, not the server."""
    values = ",".join(["1.5"] * 10_000_000)
    name = "IN_FP32" if model == "identity" else "INPUT0"
    tensor = f'{{"name":"{name}","datatype":"FP32","shape":[10000000],"data":[{values}]}}'
    body = f'{{"inputs":[{tensor}]}}'.encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _json_attack(server: ShoalServer, model: str) -> str:
    request = _json_request(model)
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(request)
        status, _ = read_response(sock)
    return f"{len(request) / 1e6:.0f} MB: HTTP {status} after {time.monotonic() - started:.2f} s"


def json_body(server: ShoalServer) -> str:
    """A 40 MB JSON infer body (10 million FP32 values) for ``identity``, whose output is answered
    as JSON too (the probes share its one instance)."""
    return _json_attack(server, "identity")


def json_parse(server: ShoalServer) -> str:
    """The same body for ``add_sub``: parsed whole, then refused (400, the shape), so that what
    the probes measure is the parse alone, not a model instance they share."""
    return _json_attack(server, "add_sub")


def header(server: ShoalServer) -> str:
    """One 128 MiB header value."""
    with _connect(server) as sock:
        started = time.monotonic()
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
            chunk = b"a" * MIB
            for _ in range(128):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            status, _ = read_response(sock)
        except (AssertionError, ConnectionResetError):
            return f"closed after {time.monotonic() - started:.2f} s"
    return f"HTTP {status} after {time.monotonic() - started:.2f} s"


ATTACKS: dict[str, Callable[[ShoalServer], str]] = {
    "none": none,
    "bodies": bodies,
    "prefixes": prefixes,
    "ping": ping,
    "settings": settings,
    "zeros": zeros,
    "gzip16k": gzip16k,
    "gzip1m": gzip1m,
    "json": json_body,
    "json-parse": json_parse,
    "header": header,
}


#: What an attack makes before the probes start (work in this process that would stall them).
PREPARE: dict[str, Callable[[], object]] = {
    "json": lambda: _json_request("identity"),
    "json-parse": lambda: _json_request("add_sub"),
}


def run(name: str) -> Outcome:
    PREPARE.get(name, lambda: None)()
    with ShoalServer(BUNDLED, timeout=120) as server:
        assert server.proc is not None
        pid = server.proc.pid
        stubs = server.stub_pids()
        time.sleep(1)
        baseline = _rss(pid)
        peak = baseline
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        probes = [_Probe(server, "http"), _Probe(server, "grpc")]
        sampler.start()
        for probe in probes:
            probe.start()
        time.sleep(0.5)
        for probe in probes:
            probe.worst = 0.0  # from here on: during the attack
        try:
            ended = ATTACKS[name](server)
        except Exception as exc:  # the attack's own failure is a result too
            ended = f"attack failed: {exc!r}"
        time.sleep(0.5)
        for probe in probes:
            probe.stop.set()
            probe.join(120)
        done.set()
        sampler.join()
        survived = server.proc.poll() is None and server.stub_pids() == stubs
        return Outcome(peak - baseline, probes[0].worst, probes[1].worst, ended, survived)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attacks", nargs="*", help=f"some of: {', '.join(ATTACKS)}")
    args = parser.parse_args()
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    print("| attack | RSS growth | slowest HTTP probe | slowest gRPC probe | ended | survived |")
    print("|---|---|---|---|---|---|")
    for name in args.attacks or ATTACKS:
        outcome = run(name)
        print(
            f"| {name} | {outcome.rss_growth / MIB:.0f} MiB | {outcome.http_worst * 1000:.0f} ms "
            f"| {outcome.grpc_worst * 1000:.0f} ms | {outcome.ended} | "
            f"{'yes' if outcome.survived else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
