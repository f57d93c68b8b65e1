"""Running an ASGI app with uvicorn inside an event loop that someone else owns.

uvicorn's ``Server.serve`` normally takes over the process's signals and binds its own socket. In
shoal the CLI owns signals and the supervisor owns the loop, so the server here installs no signal
handlers, serves a socket bound beforehand (port 0 works, and "address in use" is a clear error
raised by ``start``), and says when it has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Generator
from typing import Any

import uvicorn


class AddressInUseError(OSError):
    """Another socket already listens on a frontend's host and port."""

    def __str__(self) -> str:
        return str(self.strerror)  # logged as it is, without "[Errno 98]"


#: Triton's names of its endpoints where shoal's differ (main.cc's "failed to start GRPC service").
_TRITON_NAMES = {"gRPC": "GRPC", "metrics": "Metrics", "SageMaker": "Sagemaker"}


def address_in_use(what: str, host: str, port: int) -> AddressInUseError:
    """A taken port in Triton's words (``failed to start GRPC service: Unavailable - Socket
    '0.0.0.0:8001' already in use``): scripts and its QA grep the log for them."""
    name = _TRITON_NAMES.get(what, what)
    return AddressInUseError(
        errno.EADDRINUSE,
        f"failed to start {name} service: Unavailable - Socket '{host}:{port}' already in use",
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone and reports when it accepts connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.started_event = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.started_event.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The CLI handles SIGINT/SIGTERM and calls HttpServer.stop(); see DESIGN.md.
        yield


async def wait_started(server: EmbeddedServer, serving: asyncio.Task[None]) -> None:
    """Return once ``server`` listens; re-raise what stopped ``serving`` if it ended first."""
    started = asyncio.ensure_future(server.started_event.wait())
    try:
        await asyncio.wait({started, serving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
    if not server.started_event.is_set():
        serving.result()  # raises the startup error, if there was one
        raise RuntimeError("the HTTP server stopped before it started")


def bind_socket(
    host: str, port: int, what: str = "HTTP", reuse_port: bool = False
) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: any free port) for the ``what`` frontend;
    ``reuse_port`` (``--reuse-http-port``) lets other servers that set it bind the same port."""
    family, kind, proto, address = _address(host, port, what)
    sock = socket.socket(family, kind, proto)
    try:
        # Restart at once on a port whose old connections linger in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise address_in_use(what, host, port) from exc
        raise
    return sock


def _address(host: str, port: int, what: str) -> tuple[int, int, int, Any]:
    """Family, type, protocol and address to bind ``host:port`` to."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve the {what} host '{host}': {exc}") from exc
    return family, kind, proto, address
