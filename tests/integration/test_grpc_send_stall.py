"""gRPC connections whose client stops taking part: answers it never takes (a zero HTTP/2
window, or a socket it never reads), answers piling up on one connection, keepalive PINGs it
does not answer, and the connection's maximum age (docs/hardening.md, "gRPC connections").
With frontend workers and without (``SHOAL_TEST_FRONTEND_WORKERS``)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2.events import PingReceived
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame

from tests.h2client import H2Client, RawClient, grpc_frame, identity_request, request_headers
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer, tcp_sockets

pytestmark = pytest.mark.timeout(120)

#: ``--grpc-send-timeout-secs`` of the stalling server: short, so that a test waits little.
SEND_TIMEOUT = 1.5
#: ``--grpc-max-connection-send-buffer-size`` of the bounded server.
SEND_BUFFER = 1 << 20
ENHANCE_YOUR_CALM = 0xB
RESOURCE_EXHAUSTED = "8"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"


def _serve(*flags: str) -> Iterator[ShoalServer]:
    args = ("--model-control-mode", "explicit", "--load-model", "identity", *flags)
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args, metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


@pytest.fixture(scope="module")
def stalling() -> Iterator[ShoalServer]:
    yield from _serve("--grpc-send-timeout-secs", str(SEND_TIMEOUT))


@pytest.fixture(scope="module")
def bounded() -> Iterator[ShoalServer]:
    yield from _serve("--grpc-max-connection-send-buffer-size", str(SEND_BUFFER))


@pytest.fixture(scope="module")
def keepalive() -> Iterator[ShoalServer]:
    yield from _serve("--grpc-keepalive-time", "500", "--grpc-keepalive-timeout", "1000")


@pytest.fixture(scope="module")
def aging() -> Iterator[ShoalServer]:
    yield from _serve(
        "--grpc-max-connection-age", "1000", "--grpc-max-connection-age-grace", "1000"
    )


def _arena_used(server: ShoalServer) -> int:
    """Bytes allocated in all the server's shared-memory arenas (outputs lent to answers too)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    lines = [line for line in text.splitlines() if line.startswith("shoal_arena_used_bytes{")]
    return sum(int(float(line.split()[-1])) for line in lines)


def _wait_arena_back(server: ShoalServer, before: int) -> None:
    deadline = time.monotonic() + 30
    while (used := _arena_used(server)) > before and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the gauge
    assert used <= before, f"{used - before} arena bytes were never given back"


def _identity_call(server: ShoalServer) -> None:
    data = np.arange(4, dtype=np.int32)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput("IN_INT32", [4], "INT32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer("identity", inputs, client_timeout=60)
    np.testing.assert_array_equal(result.as_numpy("OUT_INT32"), data)


def _call(size: int) -> bytes:
    """A gRPC message asking the identity model for an answer of ``size`` bytes."""
    return grpc_frame(identity_request(np.zeros(size, np.uint8)))


def _until_closed(client: H2Client) -> None:
    """Read until the server ends the connection (a socket timeout fails the test)."""
    try:
        while True:
            client.pump()
    except (ConnectionError, ConnectionResetError):
        return


def test_an_answer_held_by_a_zero_window_ends_the_connection(stalling: ShoalServer):
    """The client's window stays 0: its answer (and the output block it views) waited as long
    as the connection lived. Now the connection ends with GOAWAY once the answer has waited
    ``--grpc-send-timeout-secs`` with nothing taken, and the blocks go back."""
    _identity_call(stalling)
    before = _arena_used(stalling)
    with H2Client(stalling.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: 0}, 20) as client:
        client.ack = False
        stream_id = client.start(_call(1 << 20))
        while not client.responses[stream_id].headers:  # answered; its DATA waits
            client.pump()
        start = time.monotonic()
        _until_closed(client)
        waited = time.monotonic() - start
    assert client.terminated is not None, "no GOAWAY"
    assert client.terminated.error_code == ENHANCE_YOUR_CALM
    assert b"--grpc-send-timeout-secs" in (client.terminated.additional_data or b"")
    assert waited < SEND_TIMEOUT * 4
    _wait_arena_back(stalling, before)
    _identity_call(stalling)


@pytest.mark.parametrize("goaway", [False, True], ids=["open", "client-goaway"])
def test_a_client_that_never_reads_its_socket_is_cut(stalling: ShoalServer, goaway: bool):
    """The client's windows are the largest there are, and it reads nothing: the answer sat in
    the transport's buffer. Now the connection is reset after the send timeout, also once the
    client sent GOAWAY (the server's graceful close waits for the buffer to empty)."""
    _never_read_answer(stalling, goaway, within=SEND_TIMEOUT * 6)
    _identity_call(stalling)


def _never_read_answer(server: ShoalServer, goaway: bool, within: float) -> None:
    """A 16 MiB answer asked for and never read; the server's end must be gone ``within``
    seconds once accepted, and the answer's output blocks back."""
    before = _arena_used(server)
    with RawClient(server.grpc_port, timeout=60) as raw:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        headers = request_headers(server.grpc_port, "/inference.GRPCInferenceService/ModelInfer")
        raw.send(HeadersFrame(1, raw.block(headers), flags=["END_HEADERS"]))
        body = _call(16 << 20)
        for offset in range(0, len(body), 16384):
            last = offset + 16384 >= len(body)
            chunk = body[offset : offset + 16384]
            raw.send(DataFrame(1, chunk, flags=["END_STREAM"] if last else []))
        if goaway:
            raw.send(GoAwayFrame(0, last_stream_id=0, error_code=0))
        client_port = raw.sock.getsockname()[1]
        deadline = time.monotonic() + 60
        while not (ours := _server_end(server, client_port)):
            assert time.monotonic() < deadline, "the connection was never accepted"
            time.sleep(0.05)  # polling the kernel's socket table
        deadline = time.monotonic() + within
        while _server_end(server, client_port) & ours:
            assert time.monotonic() < deadline, "the server kept a connection that never reads"
            time.sleep(0.05)  # polling the kernel's socket table
    _wait_arena_back(server, before)


def _server_end(server: ShoalServer, client_port: int) -> set[str]:
    found = tcp_sockets(local_port=server.grpc_port, remote_port=client_port)
    return found - {"socket:[0]"}


def test_a_steady_slow_reader_is_not_cut(stalling: ShoalServer):
    """A 4 MiB answer read 64 KiB at a time, in longer than the send timeout: each window the
    client gives back restarts the time."""
    size = 4 << 20
    with H2Client(stalling.grpc_port, timeout=30) as client:
        stream_id = client.start(_call(size))
        start = time.monotonic()
        response = client.responses[stream_id]
        while not response.done:
            client.pump()
            time.sleep(0.05)  # a slow reader, not a wait for readiness
    assert response.status == "0", response.message
    assert len(response.data) > size
    assert time.monotonic() - start > SEND_TIMEOUT


def test_answers_waiting_on_one_connection_are_bounded(bounded: ShoalServer):
    """A client with a zero window opens call after call with large answers: each waited
    (memory without bound). Now the call whose answer would pass
    ``--grpc-max-connection-send-buffer-size`` fails RESOURCE_EXHAUSTED; smaller ones still go,
    and everything waiting arrives once the client reads."""
    with H2Client(bounded.grpc_port, {SettingCodes.INITIAL_WINDOW_SIZE: 0}, 30) as client:
        client.ack = False
        first = client.start(_call(SEND_BUFFER * 3 // 4))
        while not client.responses[first].headers:  # answered; its DATA waits
            client.pump()
        refused = client.wait(client.start(_call(SEND_BUFFER // 2)))
        assert refused.status == RESOURCE_EXHAUSTED, refused.message
        assert "--grpc-max-connection-send-buffer-size" in (refused.message or "")
        small = client.start(_call(16))
        while not client.responses[small].headers:
            client.pump()
        client.ack = True
        client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        client.flush()
        assert client.wait(first).status == "0"
        assert client.wait(small).status == "0"
    _identity_call(bounded)


def test_an_unanswered_keepalive_ping_closes_the_connection(keepalive: ShoalServer):
    """``--grpc-keepalive-time``: the server PINGs a client with a call open that it heard
    nothing from; one that does not answer within ``--grpc-keepalive-timeout`` is closed."""
    with RawClient(keepalive.grpc_port, timeout=10) as raw:
        headers = raw.block(request_headers(keepalive.grpc_port, STREAM_PATH))
        raw.send(HeadersFrame(1, headers, flags=["END_HEADERS"]))  # a stream call left open
        pinged = None
        frames = []
        while (frame := raw.read_frame()) is not None:
            frames.append(frame)
            if isinstance(frame, PingFrame) and "ACK" not in frame.flags and pinged is None:
                pinged = time.monotonic()
        closed = time.monotonic()
    assert pinged is not None, frames
    assert closed - pinged >= 0.9
    goaway = [frame for frame in frames if isinstance(frame, GoAwayFrame)]
    assert goaway and b"--grpc-keepalive-timeout" in goaway[0].additional_data


def test_a_client_that_answers_keepalive_pings_stays(keepalive: ShoalServer):
    """A client that answers (h2 acknowledges PINGs) stays. As grpc-core (Triton), no PING
    while no call is open (``--grpc-keepalive-permit-without-calls`` false); with a call open,
    after two PINGs without data from the server (``--grpc-http2-max-pings-without-data``) the
    next waits for data."""
    with H2Client(keepalive.grpc_port, timeout=2) as client:
        with pytest.raises(TimeoutError):  # four keepalive times with no call: no PING
            while True:
                assert not any(isinstance(event, PingReceived) for event in client.pump())
        client.start(None, path=STREAM_PATH, end_stream=False)  # a stream call left open
        pings = 0
        while pings < 2:
            pings += sum(isinstance(event, PingReceived) for event in client.pump())
        with pytest.raises(TimeoutError):  # no third PING before the server sends data
            while True:
                assert not any(isinstance(event, PingReceived) for event in client.pump())
        response = client.call(_call(16))
        assert response.status == "0", response.message
        while not any(isinstance(event, PingReceived) for event in client.pump()):
            pass


def test_a_never_read_connection_past_its_age_is_cut_after_the_grace(aging: ShoalServer):
    """The maximum age's GOAWAY closes gracefully, which waits for the buffer to empty: a
    client that takes nothing is cut once the grace passed (the send timeout is 60 s here)."""
    _never_read_answer(aging, goaway=False, within=10.0)
    _identity_call(aging)


def test_a_connection_past_its_age_goes_away_then_closes_after_the_grace(aging: ShoalServer):
    """``--grpc-max-connection-age``: GOAWAY (a client opens a new connection); a stream still
    open is cut ``--grpc-max-connection-age-grace`` later."""
    with RawClient(aging.grpc_port, timeout=10) as raw:
        start = time.monotonic()
        headers = raw.block(request_headers(aging.grpc_port, STREAM_PATH))
        raw.send(HeadersFrame(1, headers, flags=["END_HEADERS"]))
        goaway_at = None
        while (frame := raw.read_frame()) is not None:
            if isinstance(frame, GoAwayFrame) and goaway_at is None:
                goaway_at = time.monotonic()
                assert frame.error_code == 0
        closed = time.monotonic()
    assert goaway_at is not None
    assert goaway_at - start >= 0.9 and closed - goaway_at >= 0.9
    _identity_call(aging)
