"""uvicorn's httptools protocol, with a response's writes coalesced into one system call.

uvicorn writes a response's status line and headers, then its body, with two ``transport.write``
calls: two ``send`` system calls, and a client woken twice (waking a process is the most
expensive part of a small request on a VM). Here the writes of one event-loop iteration leave
together, through one ``writelines`` (a single ``writev``, without joining a large body into a
copy). Nothing waits: the flush runs at the end of the same iteration. A whole small response
(the fast path's, head and body joined) is written at once instead (``write_now``): one ``send``
either way, without a flush handle made and run for it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Final, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check here.
        coalescing = CoalescingTransport(cast(asyncio.Transport, transport))
        super().connection_made(cast(asyncio.Transport, coalescing))


class CoalescingTransport:
    """Holds writes until the end of the loop iteration; everything else goes straight through."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes | bytearray | memoryview] = []
        self._loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        #: The socket's descriptor, which a lent body is written to directly (-1: never).
        self._fd: int = -1 if sock is None else sock.fileno()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Write ``data`` (a whole small response) at once, not at the end of the iteration:
        no flush is scheduled for it (a handle made and run per response). Behind writes still
        held, it waits with them, in order."""
        if self._pending:
            self._pending.append(data)
        elif not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def send_lent(self) -> None:
        """Send what is written now, whose pieces view a lent body's shared memory, so that
        the memory can be released at once: straight from the memory, what the kernel takes
        now (``writev`` on the socket, when the transport has nothing queued that must go
        first), and a copy of the rest through the transport. A client that does not read
        never holds shared memory (docs/hardening.md): at worst its answer is copied, as
        before."""
        pending, self._pending = self._pending, []
        transport = self._transport
        if not pending or transport.is_closing():
            return
        sent = 0
        if self._fd >= 0 and not transport.get_write_buffer_size() and len(pending) <= _IOV:
            try:
                sent = os.writev(self._fd, pending)
            except OSError:  # full (EAGAIN), or broken: the transport finds out and closes
                sent = 0
        rest = _unsent(pending, sent)
        if rest:
            transport.writelines(rest)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def is_closing(self) -> bool:
        # Asked for every request: not through ``__getattr__``'s generic look-up.
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


#: Pieces of one ``writev`` at most (Linux's ``IOV_MAX`` is 1024).
_IOV: Final = 512


def _unsent(pieces: list[bytes | bytearray | memoryview], sent: int) -> list[bytes]:
    """The pieces after the first ``sent`` bytes, as copies of their own."""
    rest: list[bytes] = []
    for piece in pieces:
        size = len(piece) if not isinstance(piece, memoryview) else piece.nbytes
        if sent >= size:
            sent -= size
            continue
        rest.append(bytes(memoryview(piece).cast("B")[sent:]) if sent else bytes(piece))
        sent = 0
    return rest
