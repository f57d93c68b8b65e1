"""A large JSON response leaves in pieces (docs/hardening.md, class D): the same bytes through
the fast path, the ASGI path and gzip, in process and through frontend workers, and a client
that hangs up halfway leaves the server serving."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.http1 import read_head_and_body
from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

VALUES = np.random.default_rng(3).standard_normal(300_000).astype(np.float32)  # 5 slices


@pytest.fixture(scope="module", params=["in-process", "workers"])
def server(request: pytest.FixtureRequest) -> Iterator[ShoalServer]:
    extra = ("--frontend-workers", "2") if request.param == "workers" else ()
    with ShoalServer(BUNDLED, extra_args=extra) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _body() -> bytes:
    tensor = {"name": "IN_FP32", "datatype": "FP32", "shape": [VALUES.size]}
    tensor["data"] = VALUES.tolist()
    return json.dumps({"inputs": [tensor]}).encode()


def _raw(server: ShoalServer, path: str, *headers: str) -> tuple[bytes, bytes]:
    body = _body()
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *headers]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return read_head_and_body(sock)


def test_tritonclient_reads_a_large_json_output(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("IN_FP32", [VALUES.size], "FP32")
        tensor.set_data_from_numpy(VALUES)
        wanted = [httpclient.InferRequestedOutput("OUT_FP32", binary_data=False)]
        result = client.infer("identity", [tensor], outputs=wanted)
        np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), VALUES)
    finally:
        client.close()


def test_fast_asgi_and_gzip_ways_send_the_same_document(server: ShoalServer) -> None:
    fast_head, fast = _raw(server, "/v2/models/identity/infer")
    _, asgi = _raw(server, "/v2/models/identit%79/infer")  # percent-encoded: the ASGI way
    zip_head, zipped = _raw(server, "/v2/models/identity/infer", "Accept-Encoding: gzip")
    assert fast_head.startswith(b"HTTP/1.1 200")
    assert fast == asgi == gzip.decompress(zipped)
    assert b"content-encoding: gzip" in zip_head.lower()
    (output,) = json.loads(fast)["outputs"]
    np.testing.assert_array_equal(np.array(output["data"], np.float32), VALUES)


def test_a_client_gone_halfway_leaves_the_server_serving(server: ShoalServer) -> None:
    body = _body()
    head = f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(head.encode() + b"\r\n\r\n" + body)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    test_tritonclient_reads_a_large_json_output(server)
