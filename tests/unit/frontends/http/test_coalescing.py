"""CoalescingTransport: writes of one loop iteration leave together, in order; a whole small
response written at once (``write_now``) leaves at once, unless writes are still held."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from shoal.frontends.http._coalescing import CoalescingTransport

pytestmark = pytest.mark.timeout(30)

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def _run(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    body: Callable[[CoalescingTransport, socket.socket], Coroutine[Any, Any, None]],
) -> None:
    """``body`` on a loop, with a coalescing transport over one end of a socket pair and the
    other end (non-blocking) to read what was sent."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = new_loop()

    async def main() -> None:
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
        try:
            await body(CoalescingTransport(transport), theirs)  # type: ignore[arg-type]
        finally:
            transport.close()
            await asyncio.sleep(0)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        theirs.close()


def _sent(peer: socket.socket) -> bytes:
    try:
        return peer.recv(1 << 16)
    except BlockingIOError:
        return b""


async def _next_iterations() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_writes_are_held_until_the_end_of_the_iteration(new_loop: Any) -> None:
    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.write(b"head ")
        transport.write(b"body")
        assert _sent(peer) == b""
        await _next_iterations()
        assert _sent(peer) == b"head body"

    _run(new_loop, body)


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_write_now_sends_at_once(new_loop: Any) -> None:
    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.write_now(b"whole response")
        assert _sent(peer) == b"whole response"  # the loop has not run meanwhile

    _run(new_loop, body)


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_write_now_behind_held_writes_keeps_their_order(new_loop: Any) -> None:
    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.write(b"first ")
        transport.write_now(b"second")
        assert _sent(peer) == b""
        await _next_iterations()
        assert _sent(peer) == b"first second"

    _run(new_loop, body)


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=list(LOOPS))
def test_write_now_on_a_closing_transport_sends_nothing(new_loop: Any) -> None:
    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.close()
        transport.write_now(b"late")
        await _next_iterations()
        assert _sent(peer) == b""

    _run(new_loop, body)
