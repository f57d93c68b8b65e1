"""The stub's direct rings: Executes a frontend worker sent straight here, and their Results.

With direct dispatch (docs/decisions.md) the core attaches a ring per frontend worker to the
stub (``ipc/down_set.py`` reads them all); an Execute that came on one is answered on it. The
output blocks a Result lends a worker are tracked per worker, so that a worker that goes away
(the core detaches its ring) leaves none of them allocated.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.down_set import DownSet
from shoal.ipc.queue import Channel, PeerGone

_Key = tuple[int, int, int]


class DirectRings:
    """The workers' rings of one stub, their pending fds and the blocks lent through them."""

    def __init__(self, downs: DownSet) -> None:
        self.downs = downs
        #: Direct channels' fds read from the socket, by worker, until attached.
        self.fds: dict[int, list[int]] = {}
        #: Channels detached, closed by the main loop between batches (another thread may be
        #: sending on one now).
        self._detached: list[Channel] = []
        self._lent: dict[int, dict[_Key, Block]] = {}
        #: Frees output blocks (the stub's arena); set once the arena exists.
        self.free: Callable[[list[Block]], None] = lambda blocks: None
        #: The stub's output arena: only its blocks are lent to workers (an output may also
        #: be an input of the request, answered as it is: that block is the worker's).
        self.arena_id = -1

    def attach(self, origin: int, fds: list[int], pidfd: int | None) -> None:
        """Read worker ``origin``'s ring; ``pidfd``, the worker's, ends a wait for room in
        its up ring when it exits."""
        self.downs.add(origin, Channel.attach(fds, peer_pidfd=pidfd))

    def detach(self, origin: int) -> None:
        """Stop reading worker ``origin``'s ring, and free what it had not given back."""
        channel = self.downs.remove(origin)
        if channel is not None:
            self._detached.append(channel)
        lent = self._lent.pop(origin, None)
        if lent:
            self.free(list(lent.values()))

    def released(self, origin: int, blocks: list[Block]) -> None:
        """Worker ``origin`` wrote the outputs in these blocks."""
        blocks = [block for block in blocks if block.arena_id == self.arena_id]
        lent = self._lent.get(origin)
        if lent is not None:
            for block in blocks:
                lent.pop(_key(block), None)
        self.free(blocks)

    def send(self, origin: int, result: msg.Result) -> None:
        """``result`` to the worker whose ring its Execute came on; a worker gone meanwhile
        leaves its blocks to free here."""
        blocks = [
            out.location
            for record in result.responses
            for out in record.outputs
            if isinstance(out.location, Block) and out.location.arena_id == self.arena_id
        ]
        channel = self.downs.channel(origin)
        if channel is not None:
            lent = self._lent.setdefault(origin, {})
            for block in blocks:
                lent[_key(block)] = block
            try:
                channel.send_up(msg.encode(result))
                return
            except PeerGone:
                blocks = list(self._lent.pop(origin, {}).values())
        if blocks:
            self.free(blocks)

    def close_detached(self) -> None:
        while self._detached:
            self._detached.pop().close()

    def close(self) -> None:
        self.close_detached()
        self.downs.close_direct()


def _key(block: Block) -> _Key:
    return (block.arena_id, block.segment, block.offset)
