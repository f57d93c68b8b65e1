"""Misbehaving clients: slow senders, stalled readers, clients that go away, deadlines.

One client's behaviour must never hold up another's requests, and a client that disappears at any
point must leave the server healthy with nothing leaked: the input arena empty again
(``shoal_arena_used_bytes``), no socket left open in the supervisor, no stub died.

Timeouts, as shoal implements them today (see docs/hardening.md):

* the request parameter ``timeout`` (µs; tritonclient's ``timeout=``) expires a request still
  queued at its deadline, on every scheduler (the dynamic and sequence batchers through their
  queue policies, the default scheduler on its own timer): ``Request timeout expired``, 503 /
  UNAVAILABLE, and the model never runs it; a request already running is not interrupted;
* a gRPC deadline (tritonclient's ``client_timeout``) that expires while the request is queued
  drops it: the model never runs it. One that expires while it runs cancels the RPC, the client
  gets DEADLINE_EXCEEDED at its deadline, and the model finishes (its answer is dropped);
* an HTTP client that disconnects does not cancel its ``/infer`` request: it runs, its answer is
  dropped.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.http1 import read_response
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
MODELS = ("add_sub", "identity", "slow", "batch_echo")
CLIENT_TIMEOUT = 30.0
#: The time a slow sender spreads its request over.
TRICKLE_S = 2.0


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args), metrics=True) as srv:
        stubs = srv.stub_pids()
        yield srv
        assert srv.stub_pids() == stubs, "a stub died or restarted"


@pytest.fixture
def baseline(server):
    """The supervisor's open fds before the test; after it, they must come back to that."""
    # The supervisor maps a stub's output segments on first use: use every model once.
    add_sub_works(server)
    assert _post(server, "/v2/models/slow/infer", slow_body(0.0))[0] == 200
    assert _post(server, "/v2/models/identity/infer", *identity_request(16))[0] == 200
    before = _fd_count(server)
    yield
    deadline = time.monotonic() + 10
    while _fd_count(server) > before and time.monotonic() < deadline:
        time.sleep(0.05)  # polling /proc: the server closes sockets as it sees them go
    assert _fd_count(server) <= before, "the server kept file descriptors open"
    wait_arena_empty(server)
    add_sub_works(server)


# --- helpers ------------------------------------------------------------------------------------


def _fd_count(server: ShoalServer) -> int:
    """The server's open fds but its arena segments: with frontend workers the core keeps one
    per worker segment it has been handed (held, not leaked, until the segment is retired)."""
    assert server.proc is not None
    fds = f"/proc/{server.proc.pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        try:
            count += not os.readlink(f"{fds}/{fd}").startswith("/memfd:")
        except FileNotFoundError:
            continue  # closed while we looked
    return count


def _address(server: ShoalServer) -> tuple[str, int]:
    host, port = server.url.split(":")
    return host, int(port)


def _post(server: ShoalServer, path: str, body: bytes, headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection(*_address(server), timeout=CLIENT_TIMEOUT)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


ADD_SUB = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [10, 20, 30, 40]},
        ]
    }
).encode()


def add_sub_works(server: ShoalServer) -> float:
    """A good add_sub request succeeds with the right answer; returns how long it took."""
    started = time.monotonic()
    status, body = _post(server, "/v2/models/add_sub/infer", ADD_SUB)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]
    return time.monotonic() - started


def slow_body(seconds: float, **parameters) -> bytes:
    document = {
        "inputs": [{"name": "SECONDS", "datatype": "FP32", "shape": [1], "data": [seconds]}]
    }
    if parameters:
        document["parameters"] = parameters
    return json.dumps(document).encode()


def identity_request(nbytes: int) -> tuple[bytes, dict[str, str]]:
    """A binary-in, binary-out identity request for a UINT8 tensor of ``nbytes``."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IN_UINT8",
                    "datatype": "UINT8",
                    "shape": [nbytes],
                    "parameters": {"binary_data_size": nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + b"\x07" * nbytes, {"Inference-Header-Content-Length": str(len(header))}


def raw_request(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: shoal\r\nContent-Length: {len(body)}\r\n"
    for key, value in (headers or {}).items():
        head += f"{key}: {value}\r\n"
    return (head + "\r\n").encode() + body


def arena_used(server: ShoalServer) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    line = next(
        t for t in text.splitlines() if t.startswith('shoal_arena_used_bytes{arena="input"}')
    )
    return int(float(line.split()[-1]))


def wait_arena_empty(server: ShoalServer) -> None:
    deadline = time.monotonic() + 10
    while (used := arena_used(server)) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the gauge
    assert used == 0, f"{used} bytes of the input arena were never given back"


def identity_inferences(server: ShoalServer) -> int:
    conn = http.client.HTTPConnection(*_address(server), timeout=CLIENT_TIMEOUT)
    try:
        conn.request("GET", "/v2/models/identity/stats")
        return int(json.loads(conn.getresponse().read())["model_stats"][0]["inference_count"])
    finally:
        conn.close()


def wait_identity_inferences(server: ShoalServer, count: int) -> None:
    deadline = time.monotonic() + 20
    while identity_inferences(server) < count and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the statistics until the model has run the requests
    assert identity_inferences(server) >= count


def executions(server: ShoalServer) -> int:
    """How many requests the slow model has started (its own log line)."""
    return server.output.count("slow: executing")


def wait_executions(server: ShoalServer, count: int) -> None:
    deadline = time.monotonic() + 20
    while executions(server) < count and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the log for the model's own line
    assert executions(server) >= count, "the slow model did not start the request"


def keep_serving_while(server: ShoalServer, busy: threading.Thread) -> list[float]:
    """add_sub requests, one after another, while ``busy`` runs; their latencies."""
    latencies = []
    while busy.is_alive():
        latencies.append(add_sub_works(server))
    return latencies


# --- slow senders -------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["body", "headers and body"])
def test_slow_sender_does_not_block_others(server, baseline, what):
    request = raw_request("/v2/models/add_sub/infer", ADD_SUB)
    head_size = request.index(b"\r\n\r\n") + 4
    at_once = head_size if what == "body" else 0
    outcome: dict[str, object] = {}

    def trickle() -> None:
        with socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(request[:at_once])
            rest = request[at_once:]
            pause = TRICKLE_S / len(rest)
            for index in range(len(rest)):
                sock.sendall(rest[index : index + 1])
                time.sleep(pause)  # pacing the slow sender, not waiting for anything
            outcome["answer"] = read_response(sock)

    sender = threading.Thread(target=trickle)
    sender.start()
    latencies = keep_serving_while(server, sender)
    sender.join()
    # Blocked, the others would wait for the whole trickle (2 s) and get through a few times.
    assert len(latencies) >= 10, latencies
    assert max(latencies) < TRICKLE_S * 0.75, f"others waited for the slow sender: {latencies}"
    status, body = outcome["answer"]
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [11, 22, 33, 44]


# --- stalled readers ----------------------------------------------------------------------------


def test_stalled_http_readers_do_not_block_others(server, baseline):
    """Clients that send requests for large answers and never read them."""
    body, headers = identity_request(8 * MIB)
    request = raw_request("/v2/models/identity/infer", body, headers)
    before = identity_inferences(server)
    stalled = []
    try:
        for _ in range(6):
            sock = socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT)
            sock.sendall(request)  # its 8 MiB answer is never read
            stalled.append(sock)
        wait_identity_inferences(server, before + len(stalled))
        started = time.monotonic()
        for _ in range(20):
            assert add_sub_works(server) < 5.0  # blocked, they would never be answered
        status, answer = _post(server, "/v2/models/identity/infer", *identity_request(MIB))
        assert status == 200, answer[:200]
        assert time.monotonic() - started < 10
        wait_arena_empty(server)  # a blocked answer holds no shared memory
    finally:
        for sock in stalled:
            sock.close()


def test_stalled_grpc_stream_reader_does_not_block_others(server, baseline):
    """A ModelStreamInfer client that sends requests for large answers and never reads them."""
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="IN_UINT8", datatype="UINT8", shape=[2 * MIB])
    request.raw_input_contents.append(bytes(2 * MIB))
    before = identity_inferences(server)
    with grpc.insecure_channel(server.grpc_url) as stalled_channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(stalled_channel).ModelStreamInfer(
            iter([request] * 8), timeout=CLIENT_TIMEOUT
        )
        try:
            wait_identity_inferences(server, before + 2)  # answers are stuck, not requests
            with grpc.insecure_channel(server.grpc_url) as channel:
                other = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                small = service_pb2.ModelInferRequest(model_name="identity")
                small.inputs.add(name="IN_INT32", datatype="INT32", shape=[3])
                small.raw_input_contents.append(np.arange(3, dtype=np.int32).tobytes())
                for _ in range(20):
                    started = time.monotonic()
                    reply = other.ModelInfer(small, timeout=CLIENT_TIMEOUT)
                    assert time.monotonic() - started < 5.0
                    assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == [
                        0,
                        1,
                        2,
                    ]
                for _ in range(5):
                    assert add_sub_works(server) < 5.0
        finally:
            stream.cancel()
    wait_arena_empty(server)


# --- clients that go away -----------------------------------------------------------------------


def test_client_disconnecting_mid_body_leaves_nothing_behind(server, baseline):
    body, headers = identity_request(2 * MIB)
    request = raw_request("/v2/models/identity/infer", body, headers)
    for cut in (len(request) // 2, len(request) - 1, request.index(b"\r\n\r\n") + 10):
        for _ in range(5):
            with socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT) as sock:
                sock.sendall(request[:cut])
        add_sub_works(server)
    # The same with a chunked body cut off mid-chunk.
    for _ in range(5):
        with socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT) as sock:
            sock.sendall(
                b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: shoal\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n400\r\n" + b" " * 100
            )
    status, answer = _post(server, "/v2/models/identity/infer", body, headers)
    assert status == 200, answer[:200]


def test_client_disconnecting_during_a_slow_request(server, baseline):
    """HTTP: the request runs to its end and its answer is dropped; the server stays healthy."""
    before = executions(server)
    with socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(raw_request("/v2/models/slow/infer", slow_body(1.0)))
        wait_executions(server, before + 1)
    # ... closed while the model runs. Also one that goes away while queued behind it:
    with socket.create_connection(_address(server), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(raw_request("/v2/models/slow/infer", slow_body(0.0)))
    status, body = _post(server, "/v2/models/slow/infer", slow_body(0.0))
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [0.0]
    # An HTTP client that goes away does not cancel its /infer request (docs/http.md): the
    # queued one runs too. Polled: the model's log line travels apart from its answer (through
    # the core's log channel), and with frontend workers the last request may be served by
    # another worker than the abandoned one, ahead of it.
    wait_executions(server, before + 3)
    assert executions(server) == before + 3


# --- per-request timeouts -----------------------------------------------------------------------


def _slow_grpc(seconds: float) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="SECONDS", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([seconds], np.float32).tobytes())
    return request


def _slow_inputs(module, seconds: float):
    tensor = module.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return [tensor]


def test_timeout_parameter_does_not_interrupt_a_running_request(server, baseline):
    """``timeout`` (µs) of 100 ms on a 0.5 s request: handed out at once, it runs to its end."""
    started = time.monotonic()
    status, body = _post(server, "/v2/models/slow/infer", slow_body(0.5, timeout=100_000))
    assert status == 200, body
    assert time.monotonic() - started >= 0.5
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("slow", _slow_inputs(grpcclient, 0.3), timeout=100_000)
        assert result.as_numpy("SECONDS_OUT").tolist() == [np.float32(0.3)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_timeout_parameter_expires_a_queued_request(server, baseline, protocol):
    """Queued behind a busy 0.8 s request, a request with a 100 ms ``timeout`` gets the dynamic
    batcher's ``Request timeout expired`` (503 / UNAVAILABLE) at its deadline and never runs."""
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    before = executions(server)
    with ThreadPoolExecutor(1) as pool, module.InferenceServerClient(url) as client:
        busy = pool.submit(_post, server, "/v2/models/slow/infer", slow_body(0.8))
        wait_executions(server, before + 1)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow", _slow_inputs(module, 0.0), timeout=100_000)
        waited = time.monotonic() - started
        assert info.value.message() == "Request timeout expired"
        assert info.value.status() in ("503", "StatusCode.UNAVAILABLE")
        assert waited < 0.7, f"answered after {waited:.2f} s, not at its deadline"
        assert busy.result(CLIENT_TIMEOUT)[0] == 200
        # A request without a timeout, and one whose timeout is long enough, run.
        assert client.infer("slow", _slow_inputs(module, 0.0)).as_numpy("SECONDS_OUT") == [0]
        client.infer("slow", _slow_inputs(module, 0.0), timeout=10_000_000)
    # The expired request never reached the model: the busy one and the last two did.
    assert executions(server) == before + 3


def test_grpc_deadline_drops_a_queued_request(server, baseline):
    before = executions(server)
    with ThreadPoolExecutor(1) as pool, grpc.insecure_channel(server.grpc_url) as channel:
        busy = pool.submit(_post, server, "/v2/models/slow/infer", slow_body(2.0))
        wait_executions(server, before + 1)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_slow_grpc(0.0), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.5  # at its deadline, not when the model is free
        assert busy.result(CLIENT_TIMEOUT)[0] == 200
        reply = stub.ModelInfer(_slow_grpc(0.0), timeout=CLIENT_TIMEOUT)
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [0.0]
    # The expired request never reached the model: the busy one and the last one did. (The
    # model's log line travels apart from its answer: with frontend workers it may come later.)
    wait_executions(server, before + 2)
    assert executions(server) == before + 2


def test_grpc_deadline_while_the_model_runs(server, baseline):
    before = executions(server)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_slow_grpc(2.0), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.5
        assert executions(server) == before + 1  # it started, and is not interrupted:
        reply = stub.ModelInfer(_slow_grpc(0.0), timeout=CLIENT_TIMEOUT)
        assert time.monotonic() - started >= 2.0  # the next one waited for it to finish
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [0.0]


# --- known bugs ---------------------------------------------------------------------------------


def test_bad_request_does_not_fail_others_in_its_batch(server):
    good = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    ).encode()
    bad = good[:-1] + b', "id": "\\udc00"}'
    for _ in range(3):  # batch_echo batches what arrives within 100 ms, up to 8
        barrier = threading.Barrier(8)

        def send(body: bytes, barrier: threading.Barrier = barrier) -> tuple[int, bytes]:
            barrier.wait()
            return _post(server, "/v2/models/batch_echo/infer", body)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(send, [bad] + [good] * 7))
        for status, body in results[1:]:
            assert status == 200, f"a good request failed with its batch: {body!r}"
