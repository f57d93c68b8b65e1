"""uvicorn's httptools protocol, with a response's writes coalesced into one system call.

uvicorn writes a response's status line and headers, then its body, with two ``transport.write``
calls: two ``send`` system calls, and a client woken twice (waking a process is the most
expensive part of a small request on a VM). Here the writes of one event-loop iteration leave
together, through one ``writelines`` (a single ``writev``, without joining a large body into a
copy). Nothing waits: the flush runs at the end of the same iteration.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

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
        self._lent = 0  # lent bodies not yet sent (hold)
        self._limits_kept = (0, 0)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def hold(self) -> bool:
        """Write what is held now, for a lent body (its memory is released once it is all
        sent); True when some is left unsent: the write limits are then 0 until :meth:`sent`,
        so that the protocol is paused until nothing is unsent (its flow control's drain)."""
        self._flush()
        transport = self._transport
        if transport.is_closing() or not transport.get_write_buffer_size():
            return False
        if not self._lent:
            self._limits_kept = transport.get_write_buffer_limits()
            transport.set_write_buffer_limits(0)
        self._lent += 1
        return True

    def sent(self) -> None:
        """A held lent body is sent (or the connection lost): the limits as they were."""
        self._lent -= 1
        if not self._lent and not self._transport.is_closing():
            low, high = self._limits_kept
            self._transport.set_write_buffer_limits(high, low)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
