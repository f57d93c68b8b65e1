"""Where the blocks of an instance's completions go back when the frontend is done with them.

Output blocks of the current stub are given back in one ``Release`` per loop turn, however many
completions were released in it; an input block passed through as an output goes back to the
input arena; the CUDA pool blocks a response handed on go back to their pools.

A ``Release`` does not wake the stub while it has a batch in flight and runs one batch at a time
(not decoupled): it reads its ring before it sleeps again, so the wake-up would be wasted. The
bell it did not ring is owed until the batch is answered (:meth:`StubOutputs.settle`): a stub
that had already gone to sleep then wakes and frees the blocks (docs/ipc.md, "Wake-ups").

A stub that exits may have answers out whose outputs lie in its arena: those it wrote whole
before dying (``UpMessages.last_words`` delivers them) and those being written to clients. The
arena is let go (its mappings closed, the frontend workers told to drop it) once they are all
released (:meth:`StubOutputs.after_answers`), or after :data:`KEEP_AT_MOST_S` at most. So the
blocks its completions hold are counted (:meth:`StubOutputs.lend`): one addition per completion
that has blocks, one subtraction per block given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.decoupled import response_blocks, response_cuda
from shoal.supervisor.instances.spec import Flag, InstanceScope

#: Blocks per ``Release``: one message must fit the stub's ring (1 MiB), and a block packs into
#: at most 37 bytes. One loop turn can release far more than that: a client that hangs up on a
#: long decoupled stream gives back every response still queued in it at once.
RELEASE_BATCH = 8192

#: Seconds an exited stub's arena stays mapped at most for the answers still out that read it:
#: views already taken keep their pages (``Segment.close``), later ones fail UNAVAILABLE.
KEEP_AT_MOST_S = 60.0


class Batches(Protocol):
    """What the stub has in flight (the instance's ``InFlightLedger``)."""

    #: Set while no batch is inside the stub.
    idle: Flag
    #: How many batches the stub runs at once.
    limit: int


class _Kept:
    """How many blocks of an exited stub's arena its answers still hold, and what waits for
    their return."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.then: list[Callable[[], None]] = []
        self.timer: asyncio.TimerHandle | None = None  # the KEEP_AT_MOST_S bound


class StubOutputs:
    """The owner of an instance's completions' blocks (a ``work.OutputOwner``)."""

    def __init__(self, scope: InstanceScope, batches: Batches | None = None) -> None:
        """``batches``: what the stub has in flight; None (a decoupled model, whose stub
        sleeps while its responses go on) rings for every ``Release``."""
        self._current = scope.current
        self._directory = scope.directory
        self._cuda = scope.directory.cuda
        self._free_inputs = scope.free_inputs
        self._outbox = scope.outbox
        self._loop = scope.loop
        self._batches = batches
        self._pending: list[Block] = []
        self._scheduled = False
        #: A ``Release`` went without the bell: the stub is woken once its batch is answered.
        self._owed: StubChannel | None = None
        #: Blocks of the current stub's arena its completions hold.
        self._lent = 0
        #: Exited stubs whose answers still hold blocks of their arena.
        self._kept: dict[StubChannel, _Kept] = {}

    def output_view(self, proc: StubChannel, block: Block | CudaLocation) -> memoryview:
        if type(block) is Block and block.arena_id == proc.output_arena_id:
            return proc.output_view(block)
        return self._directory.view(block)

    def adopt_cuda(self, proc: StubChannel, response: msg.ResponseRecord) -> list[CudaLocation]:
        """The CUDA pool blocks lent to ``proc`` that ``response`` hands on (callers on the
        hot path look at ``lent_count`` first: no GPU tensor in flight, nothing to look for)."""
        cuda = response_cuda(response)
        return self._cuda.adopt(proc.pid, cuda) if cuda else []

    def release_cuda(self, locations: list[CudaLocation]) -> None:
        if locations:
            self._cuda.free(locations)

    def release_outputs(self, proc: StubChannel, blocks: list[Block]) -> None:
        """The frontend is done with these blocks (owned by a completion): return them."""
        for block in blocks:
            if block.arena_id != proc.output_arena_id:
                self._free_inputs([block])  # a passed-through input-arena block
            elif proc is self._current.proc and proc.returncode is None:
                self._lent -= 1
                self._pending.append(block)
            else:  # an exited stub's: nothing to send, its arena may go
                self._returned(proc)
        if self._pending and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def drop(self, proc: StubChannel, response: msg.ResponseRecord) -> None:
        """Give back at once what a response nobody will read holds."""
        blocks = owned_outputs(proc, response)
        self._lent += len(blocks)
        self.release_outputs(proc, blocks)
        if self._cuda.lent_count:
            self.release_cuda(self.adopt_cuda(proc, response))

    def forget(self) -> None:
        """The stub died: its output arena goes with it, nothing is left to give back."""
        self._pending.clear()
        self._owed = None

    def lend(self, count: int) -> None:
        """A completion holds ``count`` blocks of the current stub's arena."""
        self._lent += count

    def after_answers(self, proc: StubChannel, then: Callable[[], None]) -> None:
        """Call ``then`` once the answers of the exited ``proc`` have given back the blocks of
        its arena they hold: now if none is out, in :data:`KEEP_AT_MOST_S` at most."""
        if proc is self._current.proc and self._lent > 0:  # it has just exited: counted apart
            held = self._kept[proc] = _Kept(self._lent)
            self._lent = 0
            held.timer = self._loop.call_later(KEEP_AT_MOST_S, self._let_go, proc)
        kept = self._kept.get(proc)
        if kept is None:
            then()
        else:
            kept.then.append(then)

    def _returned(self, proc: StubChannel) -> None:
        kept = self._kept.get(proc)
        if kept is not None:
            kept.count -= 1
            if kept.count <= 0:
                self._let_go(proc)
        elif proc is self._current.proc:  # (exited, its exit not yet handled)
            self._lent -= 1

    def _let_go(self, proc: StubChannel) -> None:
        kept = self._kept.pop(proc, None)
        if kept is None:
            return
        if kept.timer is not None:  # (the dead stub's channel is not held on the loop 60 s)
            kept.timer.cancel()
        for then in kept.then:
            then()

    def settle(self) -> None:
        """The stub's batches are answered: ring the bell a ``Release`` did not."""
        proc, self._owed = self._owed, None
        if proc is not None and proc is self._current.proc and proc.returncode is None:
            proc.wake()

    def _flush(self) -> None:
        self._scheduled = False
        blocks, self._pending = self._pending, []
        proc = self._current.proc
        if proc is None or proc.returncode is not None:
            return
        ring = self._must_ring()
        if not ring:
            self._owed = proc
        for start in range(0, len(blocks), RELEASE_BATCH):
            self._outbox.post(proc, msg.Release(blocks[start : start + RELEASE_BATCH]), ring)

    def _must_ring(self) -> bool:
        """Whether a ``Release`` must wake the stub: unless one sync batch is inside it (its
        main loop reads the ring when that batch ends, before it sleeps)."""
        batches = self._batches
        return batches is None or batches.limit != 1 or batches.idle.is_set()


def owned_outputs(proc: StubChannel, response: msg.ResponseRecord) -> list[Block]:
    """The blocks of ``proc``'s output arena a response's outputs lie in."""
    return [b for b in response_blocks(response) if b.arena_id == proc.output_arena_id]
