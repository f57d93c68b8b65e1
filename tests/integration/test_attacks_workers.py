"""Attacks on a running server, with frontend workers and without (``SHOAL_TEST_FRONTEND_WORKERS``):
what one client does must not stall the others, hold memory without bound, or leak.

The model ``decoupled_flood`` sends small responses as fast as it can until its request is
cancelled: a client that never reads them is the attack.
"""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2.settings import SettingCodes

from tests.h2client import H2Client, grpc_frame, int_request
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer, command_lines, tcp_sockets

pytestmark = pytest.mark.timeout(180)

STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
MODELS = ("identity", "decoupled_flood", "decoupled_repeat")
#: ``--http-send-timeout-secs`` of the server here: short, so that a test waits little.
SEND_TIMEOUT = 2


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ["--model-control-mode", "explicit", "--http-send-timeout-secs", str(SEND_TIMEOUT)]
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


def _wait_for_log(server: ShoalServer, line: str, after: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in server.output[after:]:
        assert time.monotonic() < deadline, f"{line!r} not in the log:\n{server.output[after:]}"
        time.sleep(0.05)  # polling the server's log


def _identity_call(server: ShoalServer) -> None:
    data = np.arange(4, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput("IN_FP32", [4], "FP32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer("identity", inputs, client_timeout=60)
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)


def test_a_decoupled_stream_never_read_is_ended_and_holds_no_memory(server: ShoalServer):
    """A client with a zero HTTP/2 window asks a model for endless responses: the responses
    waiting for it are bounded, the request is cancelled (the model hears it) and the stream's
    error reaches the client once it reads. Before, every response piled up in the core (and
    the link to the worker) as fast as the model sent them: gigabytes in a minute."""
    before = _rss_kib(server)
    mark = len(server.output)
    with H2Client(server.grpc_port, settings={SettingCodes.INITIAL_WINDOW_SIZE: 0}) as client:
        client.ack = False
        body = grpc_frame(int_request("decoupled_flood", "COUNT", 50_000_000))
        stream_id = client.start(body, path=STREAM_PATH, end_stream=False)
        _wait_for_log(server, "decoupled_flood: cancelled=True", mark)
        grown = _rss_kib(server) - before
        assert grown < 256 << 10, f"the server grew by {grown} KiB"
        _identity_call(server)  # others are served meanwhile
        # The client reads at last: the answers it was owed, then the stream's error.
        client.ack = True
        client.conn.increment_flow_control_window(1 << 30)
        client.conn.increment_flow_control_window(1 << 30, stream_id=stream_id)
        client.flush()
        response = client.responses[stream_id]
        while b"wait for the client (" not in response.data:
            client.pump()
    _identity_call(server)


def test_a_client_reading_behind_a_faster_model_gets_every_answer(server: ShoalServer):
    """A decoupled model answers 20,000 times faster than tritonclient reads: more than 8,192
    answers wait at times, and the stream is still not cut, because its reader keeps taking
    them (a stream is given up only when its reader took nothing for a while)."""
    count = 20_000
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        data = grpcclient.InferInput("COUNT", [1], "INT32")
        data.set_data_from_numpy(np.array([count], dtype=np.int32))
        client.async_stream_infer("decoupled_repeat", [data], enable_empty_final_response=True)
        got = 0
        while True:
            result, error = results.get(timeout=120)
            assert error is None, f"after {got} answers: {error}"
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got += 1
        client.stop_stream()
    assert got == count


def test_an_http_client_that_reads_slowly_gets_its_whole_answer(server: ShoalServer):
    """A client reads a 16 MiB answer steadily (~5 MiB/s), in more time than the send timeout:
    it is not reset, because the timeout counts only time in which it took nothing."""
    count = 4 << 20
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(60)
    received = 0
    with sock:
        sock.connect(("127.0.0.1", server.http_port))
        sock.sendall(_identity_request(count))
        start = time.monotonic()
        head = b""
        while b"\r\n\r\n" not in head:  # the response's head
            head += sock.recv(4096)
        lines = head[: head.index(b"\r\n\r\n")].lower().split(b"\r\n")
        (length,) = [
            int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")
        ]
        received = len(head) - head.index(b"\r\n\r\n") - 4
        while received < length:
            chunk = sock.recv(1 << 18)
            if not chunk:
                break
            received += len(chunk)
            time.sleep(0.05)  # a slow reader, not a wait for readiness
    assert received == length > count * 4, f"reset after {received} bytes"
    assert time.monotonic() - start > SEND_TIMEOUT  # the case: longer than the timeout


def _identity_request(count: int) -> bytes:
    """An HTTP request for the identity model's ``count`` FP32 values, answered in binary."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "IN_FP32",
                    "shape": [count],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": count * 4},
                }
            ],
            "outputs": [{"name": "OUT_FP32", "parameters": {"binary_data": True}}],
        }
    ).encode()
    request = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n"
        f"Content-Length: {len(head) + count * 4}\r\n\r\n"
    ).encode()
    return request + head + bytes(count * 4)


def test_an_http_client_that_never_reads_its_answer_is_closed_after_the_send_timeout(server):
    """A client asks for 16 MiB and reads nothing: the response (and the output blocks it
    holds) waited for it as long as it stayed connected. Now the connection is reset once the
    response has waited ``--http-send-timeout-secs`` with the socket's buffer full."""
    count = 4 << 20
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: it sticks
    sock.settimeout(60)
    with sock:
        sock.connect(("127.0.0.1", server.http_port))
        sock.sendall(_identity_request(count))
        deadline = time.monotonic() + 60
        while not (ours := _server_end(server, sock)):  # accepted: a process holds it
            assert time.monotonic() < deadline, "the connection was never accepted"
            time.sleep(0.05)  # polling the kernel's socket table
        while _server_end(server, sock) & ours:
            assert time.monotonic() < deadline, "the server kept a connection that never reads"
            time.sleep(0.05)  # polling the kernel's socket table
        received = 0
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < count * 4
    _identity_call(server)


def _server_end(server: ShoalServer, sock: socket.socket) -> set[str]:
    """The server's end of ``sock`` once a process holds it (before its accept, the kernel's
    table names it with inode 0)."""
    found = tcp_sockets(local_port=server.http_port, remote_port=sock.getsockname()[1])
    return found - {"socket:[0]"}
