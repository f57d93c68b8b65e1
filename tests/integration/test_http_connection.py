"""HTTP/1.1 connection behaviour around inference, on raw sockets.

Plain inference requests are served straight from the HTTP parser (``FastInferHttpToolsProtocol``);
the others (chunked, ``Expect: 100-continue``, oversized, percent-encoded paths) go through ASGI.
These tests pin what a client sees either way: answers in request order on a pipelined
connection, keep-alive and ``Connection: close``, HTTP/1.0, and a client that leaves mid-request.
"""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=("--http-max-input-size", "4096")) as srv:
        yield srv


def _infer_body(values: list[float]) -> bytes:
    tensor = {"name": "IN_FP32", "datatype": "FP32", "shape": [len(values)], "data": values}
    return json.dumps({"inputs": [tensor]}).encode()


def _post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    return ("\r\n".join([*head, *extra]) + "\r\n\r\n").encode() + body


def _connect(server: ShoalServer) -> socket.socket:
    host, port = server.url.rsplit(":", 1)
    sock = socket.create_connection((host.removeprefix("http://"), int(port)), timeout=20)
    return sock


class _Reader:
    """Reads Content-Length-framed HTTP/1.1 responses off a socket, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self._buffer:
            self._more()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self._buffer) < length:
            self._more()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        """True once the server closed the connection (with nothing more to read)."""
        return self._sock.recv(1) == b""

    def _more(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data


def _outputs(body: bytes) -> list[float]:
    return json.loads(body)["outputs"][0]["data"]


def test_pipelined_requests_are_answered_in_order(server):
    # Three inference requests and a metadata request in one write: the inference ones go the
    # fast way, the GET the ASGI way, and the answers must still come back in request order.
    requests = [
        _post("/v2/models/identity/infer", _infer_body([1.0])),
        _post("/v2/models/identity/infer", _infer_body([2.0, 2.5])),
        b"GET /v2/models/identity HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        _post("/v2/models/identity/versions/1/infer", _infer_body([3.0])),
    ]
    with _connect(server) as sock:
        sock.sendall(b"".join(requests))
        reader = _Reader(sock)
        answers = [reader.response() for _ in requests]
    assert [status for status, _, _ in answers] == [200, 200, 200, 200]
    assert _outputs(answers[0][2]) == [1.0]
    assert _outputs(answers[1][2]) == [2.0, 2.5]
    assert json.loads(answers[2][2])["name"] == "identity"
    assert _outputs(answers[3][2]) == [3.0]


def test_keep_alive_serves_many_requests_on_one_connection(server):
    with _connect(server) as sock:
        reader = _Reader(sock)
        for value in range(20):
            sock.sendall(_post("/v2/models/identity/infer", _infer_body([float(value)])))
            status, headers, body = reader.response()
            assert status == 200
            assert headers["content-type"] == "application/json"
            assert int(headers["content-length"]) == len(body)
            assert _outputs(body) == [float(value)]


def test_connection_close_is_honoured(server):
    with _connect(server) as sock:
        sock.sendall(_post("/v2/models/identity/infer", _infer_body([4.0]), "Connection: close"))
        reader = _Reader(sock)
        status, headers, body = reader.response()
        assert status == 200
        assert headers["connection"] == "close"
        assert _outputs(body) == [4.0]
        assert reader.closed()


def test_http_1_0_request_is_answered_and_closed(server):
    with _connect(server) as sock:
        sock.sendall(_post("/v2/models/identity/infer", _infer_body([5.0]), version="1.0"))
        reader = _Reader(sock)
        status, _, body = reader.response()
        assert status == 200
        assert _outputs(body) == [5.0]
        assert reader.closed()


@pytest.mark.parametrize("header", ["Connection: keep-alive", "Proxy-Connection: keep-alive"])
def test_http_1_0_asking_keep_alive_is_still_closed(server, header):
    """uvicorn's rule: an HTTP/1.0 connection is not kept alive, whatever its headers say (the
    fast way asks the parser's version only when one of these headers is there)."""
    with _connect(server) as sock:
        sock.sendall(_post("/v2/models/identity/infer", _infer_body([6.0]), header, version="1.0"))
        reader = _Reader(sock)
        status, _, body = reader.response()
        assert status == 200
        assert _outputs(body) == [6.0]
        assert reader.closed()


def test_errors_on_the_fast_way_match_the_asgi_way(server):
    body = _infer_body([1.0])
    with _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(_post("/v2/models/identity/versions/x/infer", body))
        status, _, answer = reader.response()
        assert status == 400
        assert "version should be an integral value" in json.loads(answer)["error"]
        sock.sendall(_post("/v2/models/nope/infer", body))
        status, _, answer = reader.response()
        assert status == 404
        assert "'nope'" in json.loads(answer)["error"]
        # The same unknown model through a percent-encoded path takes the ASGI way.
        sock.sendall(_post("/v2/models/no%70e/infer", body))
        assert reader.response()[::2] == (status, answer)


def test_a_body_over_the_limit_is_refused_unread(server):
    values = [float(v) for v in range(2000)]  # ~10 KiB of JSON, over --http-max-input-size 4096
    with _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(_post("/v2/models/identity/infer", _infer_body(values)))
        status, _, answer = reader.response()
        assert status == 400
        assert "4096" in json.loads(answer)["error"]
        # The connection stays usable: the refused body was skipped, not parsed as a request.
        sock.sendall(_post("/v2/models/identity/infer", _infer_body([6.0])))
        status, _, answer = reader.response()
        assert (status, _outputs(answer)) == (200, [6.0])


def test_chunked_and_expect_continue_requests_take_the_asgi_way(server):
    body = _infer_body([7.0, 8.0])
    chunked = (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % 10
        + body[:10]
        + b"\r\n"
        + b"%x\r\n" % (len(body) - 10)
        + body[10:]
        + b"\r\n0\r\n\r\n"
    )
    with _connect(server) as sock:
        reader = _Reader(sock)
        sock.sendall(chunked)
        status, _, answer = reader.response()
        assert (status, _outputs(answer)) == (200, [7.0, 8.0])
        head = _post("/v2/models/identity/infer", b"", "Expect: 100-continue")
        sock.sendall(head.replace(b"Content-Length: 0", f"Content-Length: {len(body)}".encode()))
        status, _, _ = reader.response()
        assert status == 100
        sock.sendall(body)
        status, _, answer = reader.response()
        assert (status, _outputs(answer)) == (200, [7.0, 8.0])


def test_a_client_leaving_mid_request_does_not_harm_the_server(server):
    slow = json.dumps(
        {"inputs": [{"name": "SECONDS", "datatype": "FP32", "shape": [1], "data": [0.5]}]}
    ).encode()
    for _ in range(3):
        sock = _connect(server)
        sock.sendall(_post("/v2/models/slow/infer", slow))
        sock.close()  # before the answer
    with _connect(server) as sock:
        sock.sendall(_post("/v2/models/identity/infer", _infer_body([9.0])))
        status, _, answer = _Reader(sock).response()
        assert (status, _outputs(answer)) == (200, [9.0])


def test_nan_and_infinities_in_json_tensors_go_both_ways(server):
    """Triton reads and writes NaN, Infinity and -Infinity in JSON tensor data (not standard
    JSON, but what tritonclient sends and reads); shoal does the same, on either way in."""
    body = b'{"inputs":[{"name":"IN_FP32","datatype":"FP32","shape":[4],'
    body += b'"data":[1.5,Infinity,-Infinity,NaN]}]}'
    for path in ("/v2/models/identity/infer", "/v2/models/identit%79/infer"):  # fast, ASGI
        with _connect(server) as sock:
            sock.sendall(_post(path, body))
            status, _, answer = _Reader(sock).response()
        assert status == 200, answer
        assert b'"data":[1.5,Infinity,-Infinity,NaN]' in answer
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("IN_FP32", [3], "FP32")
        tensor.set_data_from_numpy(np.array([np.inf, -np.inf, np.nan], np.float32), False)
        wanted = [httpclient.InferRequestedOutput("OUT_FP32", binary_data=False)]
        out = client.infer("identity", [tensor], outputs=wanted).as_numpy("OUT_FP32")
    finally:
        client.close()
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


def test_a_known_head_never_serves_a_request_whose_head_differs(server):
    """The fast path keeps a connection's last request head: every change that follows it on
    the connection (length, URL, chunked, Expect, method) is heard, and the head after it too."""
    url = "/v2/models/identity/infer"
    body = _infer_body([4.0])
    chunked = (
        f"POST {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    expecting = _post(url, _infer_body([6.0]), "Expect: 100-continue")
    expecting_head = expecting[: expecting.index(b"\r\n\r\n") + 4]
    get = f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    with _connect(server) as sock:
        reader = _Reader(sock)

        def answer(request: bytes) -> tuple[int, bytes]:
            sock.sendall(request)
            status, _, payload = reader.response()
            return status, payload

        assert _outputs(answer(_post(url, _infer_body([1.0])))[1]) == [1.0]
        assert _outputs(answer(_post(url, _infer_body([2.0])))[1]) == [2.0]  # the same head
        assert _outputs(answer(_post(url, _infer_body([1.0, 2.5])))[1]) == [1.0, 2.5]
        versioned = answer(_post("/v2/models/identity/versions/1/infer", _infer_body([3.0])))
        assert versioned[0] == 200 and _outputs(versioned[1]) == [3.0]
        assert answer(_post("/v2/models/nosuch/infer", _infer_body([3.0])))[0] == 404
        assert _outputs(answer(chunked)[1]) == [4.0]
        assert _outputs(answer(_post(url, _infer_body([5.0])))[1]) == [5.0]
        assert answer(expecting_head)[0] == 100
        assert _outputs(answer(_infer_body([6.0]))[1]) == [6.0]
        assert _outputs(answer(_post(url, _infer_body([7.0])))[1]) == [7.0]
        assert answer(get.encode() + body)[0] in (404, 405)
        assert _outputs(answer(_post(url, _infer_body([8.0])))[1]) == [8.0]
