"""What one HTTP/1.1 connection may cost the server (docs/hardening.md, "Connections").

Raw sockets against a real ``shoal serve``: bodies announced but not sent take no memory, giant
request heads get 431 without being gathered, and heads or bodies that stop arriving end with
408 once their read timeout passes, while other clients are served.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.http1 import read_response
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
#: Small limits, so that the tests run in seconds.
HEADER_LIMIT = 8192
READ_TIMEOUT = 1.5
#: How early the server's timer may end a connection: uvloop's timers count whole milliseconds.
TIMER_SLACK = 0.01


@pytest.fixture(scope="module")
def server():
    args = (
        "--http-max-header-size",
        str(HEADER_LIMIT),
        "--http-header-timeout-secs",
        str(READ_TIMEOUT),
        "--http-body-timeout-secs",
        str(READ_TIMEOUT),
    )
    with ShoalServer(BUNDLED, extra_args=args) as srv:
        yield srv


def _connect(server: ShoalServer) -> socket.socket:
    host, port = server.url.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _rss(server: ShoalServer) -> int:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _infer(server: ShoalServer) -> float:
    """One small inference on a new connection; its latency in seconds."""
    body = json.dumps(
        {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [1], "data": [1]}]}
    ).encode()
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(head + body)
        status, answer = read_response(sock)
    assert status == 200, answer
    return time.monotonic() - started


def _closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


# --- bodies -------------------------------------------------------------------------------------

#: Paths whose bodies the ASGI way reads (the plain infer path is served from the parser).
_BODY_PATHS = (
    "/v2/models/identity/infer?x=1",
    "/v2/models/identity/generate",
    "/v2/repository/index",
    "/v2/systemsharedmemory/region/r/register",
)


def test_an_announced_body_takes_memory_only_as_it_arrives(server):
    # Each connection announces nearly the whole --http-max-input-size (64 MiB) and sends 100
    # bytes: before, each made the server allocate the announced size at once.
    _infer(server)
    before = _rss(server)
    sockets = []
    try:
        for path in _BODY_PATHS * 2:
            sock = _connect(server)
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {60 * MIB}\r\n\r\n"
            sock.sendall(head.encode() + b"{" + b" " * 99)
            sockets.append(sock)
        for _ in range(3):  # the loop has read what the attackers sent before these are answered
            _infer(server)
        grown = _rss(server) - before
        assert grown < 32 * MIB, f"the server grew {grown / MIB:.0f} MiB for 800 bytes received"
    finally:
        for sock in sockets:
            sock.close()
    _infer(server)


# --- request heads ------------------------------------------------------------------------------


def test_a_head_over_the_limit_gets_431_and_the_connection_closes(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:  # the server may close while this is still being sent
            sock.sendall(b"a" * (4 * MIB))
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"--http-max-header-size" in answer
    _infer(server)


def test_many_headers_count_together(server):
    headers = "".join(f"X-H{i}: {'v' * 100}\r\n" for i in range(100))  # ~11 KiB in all
    with _connect(server) as sock:
        sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        assert _closed(sock).startswith(b"HTTP/1.1 431 ")


def test_a_head_within_the_limit_is_served_and_the_next_one_counts_afresh(server):
    filler = "v" * (HEADER_LIMIT - 200)
    request = f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Fill: {filler}\r\n\r\n".encode()
    with _connect(server) as sock:
        for _ in range(3):  # keep-alive: each head has the whole limit
            sock.sendall(request)
            assert read_response(sock)[0] == 200


def test_a_long_url_counts_against_the_limit(server):
    with _connect(server) as sock:
        sock.sendall(f"GET /v2/models/{'m' * HEADER_LIMIT} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert _closed(sock).startswith(b"HTTP/1.1 431 ")


# --- read timeouts --------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    started = time.monotonic()
    with _connect(server) as sock:
        answer = _closed(sock)
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert READ_TIMEOUT - TIMER_SLACK <= waited < READ_TIMEOUT + 10


def test_a_head_trickled_slower_than_the_header_timeout_is_ended(server):
    # Slowloris: a byte of header every 0.2 s, so the connection never idles, and never ends
    # its head. The server must end it (408) around the header timeout, serving others meanwhile.
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while time.monotonic() - started < READ_TIMEOUT + 10:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            _infer(server)
            sock.settimeout(0.2)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            closed = True
            break
    assert closed, "the slow head was never ended"
    assert time.monotonic() - started >= READ_TIMEOUT - TIMER_SLACK


@pytest.mark.parametrize("path", ["/v2/models/identity/infer", "/v2/models/identity/infer?x=1"])
def test_a_body_that_stops_arriving_is_ended_after_the_body_timeout(server, path):
    # The plain infer path (served from the parser) and the ASGI way.
    with _connect(server) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
        started = time.monotonic()
        answer = _closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert READ_TIMEOUT * 0.9 <= time.monotonic() - started < READ_TIMEOUT + 10
    _infer(server)


def test_a_slow_body_that_keeps_coming_is_not_ended(server):
    # The body timeout is between two reads (nginx's rule), not for the whole body.
    body = json.dumps(
        {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [1], "data": [7]}]}
    ).encode()
    head = f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
    with _connect(server) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n")
        pieces = [body[i : i + len(body) // 5 + 1] for i in range(0, len(body), len(body) // 5 + 1)]
        started = time.monotonic()
        for piece in pieces:  # spread over more than the timeout, each gap within it
            sock.sendall(piece)
            deadline = time.monotonic() + READ_TIMEOUT / 3
            while time.monotonic() < deadline:
                _infer(server)
        assert time.monotonic() - started > READ_TIMEOUT
        status, answer = read_response(sock)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == [7]


# --- JSON depth -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/models/identity/infer", "/v2/repository/index"])
def test_json_nested_a_thousand_deep_is_refused(server, path):
    deep = "[" * 1000 + "1" + "]" * 1000
    body = (
        '{"inputs":[{"name":"IN_INT32","datatype":"INT32","shape":[1],"data":[1]}],'
        f'"parameters":{{"x":{deep}}}}}'
    ).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(head.encode() + body)
        status, answer = read_response(sock)
    assert status == 400, answer
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in json.loads(answer)["error"]


def test_pipelined_requests_past_the_head_limit_together_are_all_served(server):
    # 400 small requests in one write (~24 KiB, three times the head limit): each head has the
    # limit to itself, whatever the reads that carry them.
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = b""
    with _connect(server) as sock:
        sock.sendall(request * 400)
        while answers.count(b"HTTP/1.1 ") < 400 or not answers.endswith(b'{"live":true}'):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {answers.count(b'HTTP/1.1 ')} answers"
            answers += chunk
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 400


@pytest.mark.parametrize("chunks", [1 << 16, (1 << 16) + 1])
def test_a_body_of_more_than_65536_chunks_is_refused(server, chunks):
    """Triton's limit and words: a body of many tiny chunks costs per chunk what no limit on
    bytes sees. 65,536 are read (the request then fails as any body of bad JSON)."""
    head = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    with _connect(server) as sock:
        sock.sendall(head.encode() + b"1\r\n[\r\n" * chunks + b"0\r\n\r\n")
        status, answer = read_response(sock)
    assert status == 400, answer
    refused = "Chunked request body exceeds maximum of 65536 non-empty chunks."
    assert (refused in answer.decode()) == (chunks > 1 << 16), answer
    _infer(server)


def test_a_body_framed_by_both_lengths_is_read_chunked_and_the_connection_closed(server):
    """Content-Length and Transfer-Encoding: chunked (a client adding the header by hand): the
    body is the chunks, as Triton reads it, and the connection ends after the answer (RFC 9112
    6.3: what follows on it could be framed either way)."""
    body = json.dumps(
        {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [1], "data": [7]}]}
    ).encode()
    chunked = f"{len(body):X}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Length: {len(chunked)}\r\n\r\n"
    )
    with _connect(server) as sock:
        sock.sendall(head.encode() + chunked)
        answer = _closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == [7]
