"""Large binary inference requests and responses over HTTP/1.1, on raw sockets.

A plain request's body of 256 KiB or more is read from the socket straight into one buffer,
and a binary response of that size is sent from the response's shared memory, released once
sent (docs/perf.md, "Large HTTP bodies"). These tests pin what a client sees: bodies in many
small segments, pipelined requests behind a large body, a client that stops or leaves
mid-body, responses that a slow reader takes long to read while other requests reuse the
memory, and the Content-Length limit.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from tests.http1 import read_response
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
LIMIT = 8 * MIB
READ_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def server():
    args = ("--http-max-input-size", str(LIMIT), "--http-body-timeout-secs", str(READ_TIMEOUT))
    with ShoalServer(BUNDLED, extra_args=args) as srv:
        yield srv


def _connect(server: ShoalServer) -> socket.socket:
    host, port = server.url.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _request(data: bytes, *extra: str) -> bytes:
    """A binary identity request for ``data`` (UINT8), its output binary too."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IN_UINT8",
                    "datatype": "UINT8",
                    "shape": [len(data)],
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "OUT_UINT8", "parameters": {"binary_data": True}}],
        }
    ).encode()
    head = [
        "POST /v2/models/identity/infer HTTP/1.1",
        "Host: x",
        f"Inference-Header-Content-Length: {len(header)}",
        f"Content-Length: {len(header) + len(data)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + header + data


def read_head_and_body(sock: socket.socket) -> tuple[bytes, bytes]:
    """The next response on ``sock``: its head and body (one at a time, pipelined or not)."""
    return _Responses.of(sock).next()


class _Responses:
    """Content-Length-framed responses off one socket: what is read past one is kept for the
    next (``tests.http1`` reads one response per connection)."""

    _all: dict[int, _Responses] = {}

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()

    @classmethod
    def of(cls, sock: socket.socket) -> _Responses:
        reader = cls._all.get(id(sock))
        if reader is None or reader._sock is not sock:
            reader = cls._all[id(sock)] = cls(sock)
        return reader

    def next(self) -> tuple[bytes, bytes]:
        while b"\r\n\r\n" not in self._buffer:
            self._more()
        end = self._buffer.index(b"\r\n\r\n")
        head = bytes(self._buffer[:end])
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next(
            int(line.split(":")[1]) for line in lines if line.startswith("content-length")
        )
        while len(self._buffer) < end + 4 + length:
            self._more()
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        return head, body

    def _more(self) -> None:
        chunk = self._sock.recv(1 << 20)
        assert chunk, f"connection closed mid-response: {len(self._buffer)} bytes read"
        self._buffer += chunk


def _output(head: bytes, body: bytes) -> bytes:
    """The binary output's bytes in a response."""
    assert head.split()[1] == b"200", head + body[:300]
    lines = head.decode("latin-1").lower().split("\r\n")
    size = next(int(line.split(":")[1]) for line in lines if line.startswith("inference-header"))
    return body[size:]


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _small_infer(server: ShoalServer) -> None:
    with _connect(server) as sock:
        data = _data(64, 0)
        sock.sendall(_request(data))
        assert _output(*read_head_and_body(sock)) == data


def test_a_large_body_in_many_small_segments(server):
    data = _data(4 * MIB, 1)
    raw = _request(data)
    with _connect(server) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(raw), 1000):
            sock.sendall(raw[start : start + 1000])
        assert _output(*read_head_and_body(sock)) == data
        sock.sendall(raw)  # and again on the same connection, in one write
        assert _output(*read_head_and_body(sock)) == data


@pytest.mark.parametrize("size", [300_000, 4 * MIB])
def test_requests_pipelined_behind_a_large_body_are_answered_in_order(server, size):
    first, second, third = _data(size, 2), _data(10, 3), _data(size, 4)
    with _connect(server) as sock:
        sock.sendall(_request(first) + _request(second) + _request(third))
        assert _output(*read_head_and_body(sock)) == first
        assert _output(*read_head_and_body(sock)) == second
        assert _output(*read_head_and_body(sock)) == third


def test_responses_read_slowly_keep_their_bytes_while_others_are_served(server):
    # The slow reader's response is sent from shared memory as the client reads it; the
    # requests served meanwhile must not reuse that memory before it is all sent.
    slow_data = _data(4 * MIB, 5)
    with _connect(server) as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        slow.sendall(_request(slow_data))
        for seed in range(6, 14):
            with _connect(server) as other:
                data = _data(4 * MIB, seed)
                other.sendall(_request(data))
                assert _output(*read_head_and_body(other)) == data
        assert _output(*read_head_and_body(slow)) == slow_data


def test_a_client_leaving_before_reading_its_large_response(server):
    for seed in range(4):
        sock = _connect(server)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(_request(_data(4 * MIB, seed)))
        sock.recv(100)  # the answer has begun
        sock.close()
    for _ in range(20):  # what those responses held was given back: the memory is reused
        data = _data(4 * MIB, 20)
        with _connect(server) as sock:
            sock.sendall(_request(data))
            assert _output(*read_head_and_body(sock)) == data


def test_a_client_leaving_mid_body(server):
    raw = _request(_data(4 * MIB, 6))
    for _ in range(3):
        sock = _connect(server)
        sock.sendall(raw[: len(raw) // 2])
        sock.close()
    _small_infer(server)


def test_a_large_body_that_stops_arriving_is_ended_after_the_body_timeout(server):
    raw = _request(_data(4 * MIB, 7))
    with _connect(server) as sock:
        sock.sendall(raw[: len(raw) // 2])
        started = time.monotonic()
        status, answer = read_response(sock)
        assert status == 408, answer
        assert sock.recv(1) == b""  # closed
    assert READ_TIMEOUT * 0.9 <= time.monotonic() - started < READ_TIMEOUT + 10
    _small_infer(server)


def test_a_body_past_the_limit_is_refused(server):
    raw = _request(_data(LIMIT, 8))
    with _connect(server) as sock:
        sock.sendall(raw[:65536])
        status, answer = read_response(sock)
    assert status == 400, answer
    assert f"exceeds the maximum allowed value of {LIMIT} bytes" in answer.decode(), answer
    _small_infer(server)


def test_a_large_response_compressed(server):
    data = _data(MIB, 9)
    with _connect(server) as sock:
        sock.sendall(_request(data, "Accept-Encoding: gzip"))
        head, body = read_head_and_body(sock)
    assert b"content-encoding: gzip" in head.lower()
    assert _output(head, gzip.decompress(body)) == data


def test_an_announced_large_body_takes_memory_only_as_it_arrives(server):
    before = _rss_tree(server)
    sockets = []
    try:
        for _ in range(8):
            sock = _connect(server)
            head = f"POST /v2/models/identity/infer HTTP/1.1\r\nContent-Length: {LIMIT - 1}"
            sock.sendall(head.encode() + b"\r\n\r\n{" + b" " * 99)
            sockets.append(sock)
        for _ in range(3):  # what the others sent was read before these are answered
            _small_infer(server)
        grown = _rss_tree(server) - before
        assert grown < 16 * MIB, f"the server grew {grown / MIB:.0f} MiB for 800 bytes received"
    finally:
        for sock in sockets:
            sock.close()


def _rss_tree(server: ShoalServer) -> int:
    """The resident memory of the server and its processes (frontend workers, stubs)."""
    assert server.proc is not None
    pids, total = [server.proc.pid], 0
    while pids:
        pid = pids.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            for task in os.listdir(f"/proc/{pid}/task"):
                pids += [
                    int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
        except FileNotFoundError:
            continue
        total += (
            next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            * 1024
        )
    return total
