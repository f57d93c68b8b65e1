"""Fixtures for the HTTP frontend tests: a test double of the core and real servers.

The servers run on their own event loop (uvloop, as in the supervisor) in a background thread, so
that the synchronous ``tritonclient.http`` client can drive them from the test thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tritonclient.http as httpclient

from shoal.frontends.http.app import HttpServer, build_http_app

from .doubles import EchoCore, LoopThread


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def serve(loop_thread: LoopThread) -> Iterator[Callable[..., str]]:
    """Start ``build_http_app(core, **options)`` on 127.0.0.1, port 0; returns "host:port"."""
    servers: list[HttpServer] = []

    def start(core: Any, **options: Any) -> str:
        server = HttpServer(build_http_app(core, **options))
        port = loop_thread.run(server.start("127.0.0.1", 0))
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        loop_thread.run(server.stop())


@pytest.fixture(scope="module")
def shared_core() -> EchoCore:
    return EchoCore()


@pytest.fixture
def core(shared_core: EchoCore) -> EchoCore:
    shared_core.reset()
    return shared_core


@pytest.fixture(scope="module")
def url(serve: Callable[..., str], shared_core: EchoCore) -> str:
    return serve(shared_core)


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(url)
    yield triton
    triton.close()
