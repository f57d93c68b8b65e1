"""HttpServer: binding, start/stop, graceful shutdown, and signal handlers left alone."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

from shoal.frontends.http.app import AddressInUseError, HttpServer, build_http_app
from tests.http1 import read_response
from tests.unit.frontends.doubles import EchoCore, LoopThread

pytestmark = pytest.mark.timeout(60)


def test_port_zero_binds_a_free_port_and_stop_releases_it(loop_thread: LoopThread) -> None:
    server = HttpServer(build_http_app(EchoCore()))
    port = loop_thread.run(server.start("127.0.0.1", 0))
    assert port > 0
    assert requests.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=10).status_code == 200
    loop_thread.run(server.stop())
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=10)
    loop_thread.run(server.stop())  # stopping twice is a no-op


def test_address_in_use_is_a_clear_error(loop_thread: LoopThread) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HttpServer(build_http_app(EchoCore()))
        with pytest.raises(AddressInUseError) as info:
            loop_thread.run(server.start("127.0.0.1", port))
    socket_in_use = f"Socket '127.0.0.1:{port}' already in use"
    expected = f"failed to start HTTP service: Unavailable - {socket_in_use}"
    assert str(info.value) == expected
    assert isinstance(info.value, OSError)


def test_starting_twice_is_refused(loop_thread: LoopThread) -> None:
    server = HttpServer(build_http_app(EchoCore()))
    loop_thread.run(server.start("127.0.0.1", 0))
    try:
        with pytest.raises(RuntimeError, match="already running"):
            loop_thread.run(server.start("127.0.0.1", 0))
    finally:
        loop_thread.run(server.stop())


def test_restart_after_stop(loop_thread: LoopThread) -> None:
    server = HttpServer(build_http_app(EchoCore()))
    loop_thread.run(server.start("127.0.0.1", 0))
    loop_thread.run(server.stop())
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        assert requests.get(f"http://127.0.0.1:{port}/v2", timeout=10).status_code == 200
    finally:
        loop_thread.run(server.stop())


def test_signal_handlers_are_left_to_the_cli() -> None:
    """uvicorn replaces SIGINT/SIGTERM handlers when serving from the main thread; not here."""
    watched = (signal.SIGINT, signal.SIGTERM)

    def handlers() -> dict[int, Any]:
        return {sig: signal.getsignal(sig) for sig in watched}

    async def serve_briefly() -> tuple[dict[int, Any], ...]:
        before = handlers()  # asyncio.run has installed its own SIGINT handler by now
        server = HttpServer(build_http_app(EchoCore()))
        await server.start("127.0.0.1", 0)
        during = handlers()
        await server.stop()
        return before, during, handlers()

    before, during, after = asyncio.run(serve_briefly())
    assert during == before and after == before


def test_stop_lets_in_flight_requests_finish(loop_thread: LoopThread) -> None:
    core = EchoCore()
    server = HttpServer(build_http_app(core))
    port = loop_thread.run(server.start("127.0.0.1", 0))
    core.gate = loop_thread.run(_new_event())
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [5]}]}
    url = f"http://127.0.0.1:{port}/v2/models/echo/infer"
    # A plain blocking client in a thread: tritonclient's gevent-based async client could hang
    # in close() once the server had closed the connection (seen under load).
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(requests.post, url, json=body, timeout=30)
        assert core.entered.wait(timeout=10)  # the request is inside the core

        async def stop_while_in_flight() -> bool:
            stopping = asyncio.ensure_future(server.stop())
            # stop() would finish in well under a second if it did not wait for the request.
            done, _ = await asyncio.wait({stopping}, timeout=1.0)
            assert core.gate is not None
            core.gate.set()
            await stopping
            return not done

        assert loop_thread.run(stop_while_in_flight())
        answer = pending.result(timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [5]
    assert core.released == core.issued == 1


def test_stop_closes_idle_keep_alive_connections(loop_thread: LoopThread) -> None:
    server = HttpServer(build_http_app(EchoCore()), shutdown_timeout=5)
    port = loop_thread.run(server.start("127.0.0.1", 0))
    with requests.Session() as session:  # keeps its connection open after the request
        assert session.get(f"http://127.0.0.1:{port}/v2", timeout=10).status_code == 200
        loop_thread.run(server.stop(), timeout=5)


def _infer_request() -> bytes:
    body = b'{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"data":[5]}]}'
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


def test_keep_alive_timeout_closes_only_idle_connections(loop_thread: LoopThread) -> None:
    server = HttpServer(build_http_app(EchoCore()), keep_alive_timeout=1)
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # Requests 0.4 s apart for 2 s: never idle for the timeout, so never closed.
            for _ in range(5):
                sock.sendall(_infer_request())
                assert b'"data":[5]' in _answer(sock)
                time.sleep(0.4)
            # A request whose headers trickle in over 1.5 s is not cut off either.
            request = _infer_request()
            for piece in (request[:10], request[10:30]):
                sock.sendall(piece)
                time.sleep(0.75)
            sock.sendall(request[30:])
            assert b'"data":[5]' in _answer(sock)
            # Then idle: closed after the timeout, not before.
            idle_from = time.monotonic()
            assert sock.recv(1) == b""
            assert 0.9 <= time.monotonic() - idle_from < 5
    finally:
        loop_thread.run(server.stop(), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    status, body = read_response(sock)
    assert status == 200, body
    return body


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


def test_fast_responses_follow_the_date_header_as_it_changes(loop_thread: LoopThread) -> None:
    """The fast path encodes the server's default header lines once per list uvicorn publishes:
    on one keep-alive connection, the ``date`` still moves on with the clock."""
    server = HttpServer(build_http_app(EchoCore()))
    port = loop_thread.run(server.start("127.0.0.1", 0))
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    url = f"http://127.0.0.1:{port}/v2/models/echo/infer"
    try:
        with requests.Session() as session:
            first = session.post(url, json=body, timeout=10)
            assert first.status_code == 200
            dates = {first.headers["date"]}
            deadline = time.monotonic() + 10
            while len(dates) == 1 and time.monotonic() < deadline:
                answer = session.post(url, json=body, timeout=10)
                assert answer.status_code == 200
                assert answer.json()["outputs"][0]["data"] == [1.0]
                dates.add(answer.headers["date"])
            assert len(dates) == 2  # the next second's date, on the same connection
    finally:
        loop_thread.run(server.stop())


def test_header_names_are_read_in_any_case_request_after_request(loop_thread: LoopThread) -> None:
    """Header names are case-insensitive: the fast path remembers each name's lowercase form,
    and a binary request is read alike whatever the case of its names, sent again and again."""
    server = HttpServer(build_http_app(EchoCore()))
    port = loop_thread.run(server.start("127.0.0.1", 0))
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],'
        b'"parameters":{"binary_data_size":4}}],'
        b'"outputs":[{"name":"INPUT0","parameters":{"binary_data":false}}]}'
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            for length_name, header_name in [
                (b"Content-Length", b"Inference-Header-Content-Length"),
                (b"CONTENT-LENGTH", b"INFERENCE-HEADER-CONTENT-LENGTH"),
                (b"content-length", b"inference-header-content-length"),
                (b"Content-Length", b"Inference-Header-Content-Length"),
            ]:
                value = float(len(header_name))
                body = header + np.float32(value).tobytes()
                client.sendall(
                    b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                    + length_name
                    + b": "
                    + str(len(body)).encode()
                    + b"\r\n"
                    + header_name
                    + b": "
                    + str(len(header)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                status, answer = read_response(client)
                assert status == 200, answer
                assert json.loads(answer)["outputs"][0]["data"] == [value]
    finally:
        loop_thread.run(server.stop())


def test_a_repeated_head_is_read_as_before_and_a_changed_one_anew(loop_thread: LoopThread) -> None:
    """The fast path keeps the last request head it read on a connection: the same head again
    is served as the first, and any change (the target, a header's value, the HTTP version)
    is heard."""
    server = HttpServer(build_http_app(EchoCore()))
    port = loop_thread.run(server.start("127.0.0.1", 0))

    def header(shape: int) -> bytes:
        return (
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[%d],'
            b'"parameters":{"binary_data_size":%d}}],'
            b'"outputs":[{"name":"INPUT0","parameters":{"binary_data":false}}]}'
            % (shape, 4 * shape)
        )

    def request(target: bytes, head: bytes, values: list[float], version: bytes = b"1.1") -> bytes:
        body = head + np.array(values, dtype=np.float32).tobytes()
        return (
            b"POST %s HTTP/%s\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n\r\n%s"
            % (target, version, len(body), len(head), body)
        )

    one, two = header(1) + b"    ", header(2)  # one body size, two header sizes
    assert len(one) + 4 == len(two) + 8
    echo = b"/v2/models/echo/infer"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            for target, head, values, expected in [
                (echo, one, [1.0], 200),
                (echo, one, [2.0], 200),  # the same head
                (echo, two, [3.0, 4.0], 200),  # the same Content-Length, another header size
                (b"/v2/models/missing/infer", two, [5.0, 6.0], 404),
                (echo, two, [7.0, 8.0], 200),
            ]:
                client.sendall(request(target, head, values))
                status, answer = read_response(client)
                assert status == expected, answer
                if status == 200:
                    assert json.loads(answer)["outputs"][0]["data"] == values
                else:
                    assert "missing" in json.loads(answer)["error"]
            client.sendall(request(echo, two, [9.0, 10.0], version=b"1.0"))
            status, answer = read_response(client)
            assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [9.0, 10.0]
            assert client.recv(1) == b""  # HTTP/1.0 is not kept alive, whatever came before
    finally:
        loop_thread.run(server.stop())
