"""Connections dealt to the frontend workers: the core accepts, each worker serves its share.

Workers that all accepted on one shared listening socket split the connections by who woke
first: an event loop accepts every connection waiting in the backlog when it wakes, so a burst
of 16 connections (a load generator's start) went 16/0/0/0 or 12/4/0/0 over four workers on this
project's machine, and the busiest worker's core capped the server. Here the core accepts and
hands each connection to the next worker in turn (``ConnectionDealer``), over a sequenced-packet
socket per worker that carries the descriptor (``SCM_RIGHTS``) and one byte naming the protocol;
the worker serves it as its own listener would have (``DealtConnections``). A connection costs
the core an accept and a send, once; requests on it never touch the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Mapping, Sequence

__all__ = ["GRPC", "HTTP", "ConnectionDealer", "DealtConnections", "deal_socketpair"]

log = logging.getLogger("shoal")

#: The byte that tells a worker which protocol a dealt connection speaks.
HTTP = b"h"
GRPC = b"g"

#: Connections accepted in one turn of the core's loop: the rest wait for the next turn.
_BURST = 64
#: Seconds the dealer stops accepting after the process ran out of descriptors (as asyncio's
#: own listener does): the backlog holds the connections meanwhile.
_FD_PAUSE_SECS = 1.0
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def deal_socketpair() -> tuple[socket.socket, socket.socket]:
    """The core's end and the worker's end of one worker's dealing socket."""
    core_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    core_end.setblocking(False)
    return core_end, worker_end


class ConnectionDealer:
    """Accepts on the core's listening ``sockets`` (protocol byte -> socket) and deals each
    connection to the next of ``outlets()``, the dealing sockets of the workers that serve now
    (None for one that is starting or gone)."""

    def __init__(
        self,
        sockets: Mapping[bytes, socket.socket],
        outlets: Callable[[], Sequence[socket.socket | None]],
    ) -> None:
        self._sockets = dict(sockets)
        self._outlets = outlets
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: asyncio.TimerHandle | None = None
        #: Connections closed unserved because no worker could take them.
        self.dropped = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self._sockets.values():
            sock.setblocking(False)
        self._watch()

    def stop(self) -> None:
        """Accept no more: the listening sockets close, so new connections are refused."""
        self._unwatch()
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        self._loop = None
        for sock in self._sockets.values():
            sock.close()

    def _watch(self) -> None:
        assert self._loop is not None
        for kind, sock in self._sockets.items():
            self._loop.add_reader(sock.fileno(), self._accept, kind, sock)

    def _unwatch(self) -> None:
        if self._loop is None:
            return
        for sock in self._sockets.values():
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())

    def _accept(self, kind: bytes, sock: socket.socket) -> None:
        for _ in range(_BURST):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in _OUT_OF_FDS:
                    log.error(
                        "cannot accept connections: %s; pausing for %.0f s", error, _FD_PAUSE_SECS
                    )
                    self._pause()
                    return
                # A connection that failed before it was accepted (ECONNABORTED, a network
                # error Linux reports on accept): the next one may be fine.
                log.debug("accept failed: %s", error)
                continue
            with conn:
                self._deal(kind, conn)

    def _pause(self) -> None:
        self._unwatch()
        assert self._loop is not None
        self._paused = self._loop.call_later(_FD_PAUSE_SECS, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._loop is not None:
            self._watch()

    def _deal(self, kind: bytes, conn: socket.socket) -> None:
        """Hand ``conn`` to the next worker that takes it; closed (the client sees it reset)
        when none does."""
        # Small requests and answers leave at once, as on the workers' own sockets.
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        outlets = self._outlets()
        count = len(outlets)
        for step in range(count):
            index = (self._next + step) % count
            outlet = outlets[index]
            if outlet is None:
                continue
            try:
                socket.send_fds(outlet, [kind], [conn.fileno()])
            except OSError:
                continue  # its queue is full (the worker is stuck) or it is gone: the next one
            self._next = index + 1
            return
        self.dropped += 1
        # Once per power of two: a flood of connections while no worker serves (all restarting)
        # must not become a flood of log lines.
        if self.dropped & (self.dropped - 1) == 0:
            log.warning(
                "no frontend worker could take a new connection; it was closed (%d closed so far)",
                self.dropped,
            )


#: What makes the protocol of a dealt connection (the frontends' servers give one each).
ProtocolFactory = Callable[[], asyncio.BaseProtocol]


class DealtConnections:
    """A worker's end of its dealing socket: each connection the core deals is served with the
    protocol of its kind, as the worker's own listener would have served it."""

    def __init__(self, sock: socket.socket, factories: Mapping[bytes, ProtocolFactory]) -> None:
        self._sock = sock
        self._factories = dict(factories)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._receive)

    def stop(self) -> None:
        """Take no more connections; those dealt but not yet received close with the socket
        (their clients see them refused or reset and connect again, to another replica)."""
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        self._loop = None
        self._sock.close()

    def _receive(self) -> None:
        while self._loop is not None:
            try:
                kind, fds, _, _ = socket.recv_fds(self._sock, 1, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stop()
                return
            if not kind and not fds:  # the core closed its end: it is gone or stopping
                self.stop()
                return
            for fd in fds:
                self._serve(kind, socket.socket(fileno=fd))

    def _serve(self, kind: bytes, conn: socket.socket) -> None:
        factory = self._factories.get(kind)
        if factory is None or self._loop is None:
            conn.close()
            return
        task = self._loop.create_task(_open(self._loop, factory, conn))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)


async def _open(
    loop: asyncio.AbstractEventLoop, factory: ProtocolFactory, conn: socket.socket
) -> object:
    try:
        return await loop.connect_accepted_socket(factory, sock=conn)
    except OSError as error:  # the client went away before it was served
        log.debug("a dealt connection could not be served: %s", error)
        conn.close()
        return None
