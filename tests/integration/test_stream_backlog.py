"""A decoupled model answering faster than an HTTP ``generate_stream`` client reads: the answers
waiting for the client are bounded as they are for gRPC streams (``core.backlog``), with frontend
workers and without (``SHOAL_TEST_FRONTEND_WORKERS``).

The gRPC side is ``test_attacks_workers.py``'s. Here the server keeps its default
``--http-send-timeout-secs`` (60 s), so what ends the stream within the test's bounds is the
backlog's rule, not the connection's send timeout.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer, command_lines

pytestmark = pytest.mark.timeout(120)

MODELS = ("identity", "decoupled_flood")
#: What the core and its workers may grow by while the stream waits (the responses of a
#: 50-million-answer flood are ~2 KiB each in memory: unbounded, gigabytes in a minute).
GROWTH_BOUND_KIB = 256 << 10


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args)) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _rss_kib(server: ShoalServer) -> int:
    """The resident memory of the core and its frontend workers (not the stubs), in KiB."""
    assert server.proc is not None
    pids = [server.proc.pid]
    parent = str(server.proc.pid).encode()
    for pid, args in command_lines():
        ours = b"--parent" in args and args[args.index(b"--parent") + 1] == parent
        if ours and any(b"worker_main" in a for a in args):
            pids.append(pid)
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def _wait_for_log(server: ShoalServer, line: str, after: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while line not in server.output[after:]:
        assert time.monotonic() < deadline, f"{line!r} not in the log:\n{server.output[after:]}"
        time.sleep(0.05)  # polling the server's log


def _generate_stream_request(count: int) -> bytes:
    body = json.dumps({"COUNT": count}).encode()
    head = (
        "POST /v2/models/decoupled_flood/generate_stream HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def test_a_generate_stream_never_read_is_ended_and_holds_no_memory(server: ShoalServer):
    """The client asks for endless events and reads none: the stream ends within seconds (the
    model's request cancelled), long before the send timeout would close the connection; the
    server grows by a bounded amount, serves others meanwhile, and the events the client reads
    at last end with the error that says why."""
    before = _rss_kib(server)
    mark = len(server.output)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: it sticks
    sock.settimeout(60)
    with sock:
        sock.connect(("127.0.0.1", server.http_port))
        sock.sendall(_generate_stream_request(50_000_000))
        _wait_for_log(server, "decoupled_flood: cancelled=True", mark, timeout=45)
        grown = _rss_kib(server) - before
        assert grown < GROWTH_BOUND_KIB, f"the server grew by {grown} KiB"
        _identity_call(server)
        received = b""
        while chunk := sock.recv(1 << 20):
            received += chunk
            if received.endswith(b"0\r\n\r\n"):  # the chunked body's end
                break
    events = [line for line in received.split(b"\n") if line.startswith(b"data: ")]
    assert len(events) > 1
    error = json.loads(events[-1][len(b"data: ") :])["error"]
    # "of the request" when the core gives up, "of the stream" when a frontend worker does.
    assert error.startswith("too many responses of the ") and "wait for the client (" in error


def _identity_call(server: ShoalServer) -> None:
    data = np.arange(4, dtype=np.float32)
    with httpclient.InferenceServerClient(server.url) as client:
        inputs = [httpclient.InferInput("IN_FP32", [4], "FP32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer("identity", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
