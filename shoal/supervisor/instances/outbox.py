"""Messages to a stub that nobody waits for (releases, cancellations): sent at once, or from a
background task when the stub's ring is full."""

from __future__ import annotations

import asyncio

from shoal.ipc import messages as msg
from shoal.ipc.queue import PeerGone
from shoal.supervisor.instances.channel import StubChannel


class Outbox:
    """Sends without waiting; a message that finds the ring full waits in a task of its own."""

    def __init__(self) -> None:
        self._background: set[asyncio.Future[None]] = set()

    def post(self, proc: StubChannel, message: msg.Message, ring: bool = True) -> None:
        """``ring=False``: see ``StubChannel.send`` (a full ring sends it later, ringing)."""
        if not proc.send(message, ring):
            task = asyncio.ensure_future(_send_quietly(proc, message))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def cancel(self, proc: StubChannel, keys: list[int]) -> None:
        """Tell a live stub not to run (or to stop) the requests with these keys."""
        if proc.returncode is None:
            self.post(proc, msg.Cancel(keys))


async def _send_quietly(proc: StubChannel, message: msg.Message) -> None:
    try:
        await proc.send_async(message)
    except PeerGone:
        pass  # the stub died: what it held comes back when its exit is handled


class CancelHook:
    """A request's ``Work.on_cancel`` once it is at a stub: tells the stub its client went
    away. One object per request (a ``functools.partial`` of a bound method and a list of
    the key was three)."""

    def __init__(self, outbox: Outbox, proc: StubChannel, key: int) -> None:
        self._outbox = outbox
        self._proc = proc
        self._key = key

    def __call__(self) -> None:
        self._outbox.cancel(self._proc, [self._key])
