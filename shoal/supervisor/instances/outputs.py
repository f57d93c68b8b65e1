"""Where the blocks of an instance's completions go back when the frontend is done with them.

Output blocks of the current stub are given back in one ``Release`` per loop turn, however many
completions were released in it; an input block passed through as an output goes back to the
input arena; the CUDA pool blocks a response handed on go back to their pools.

A ``Release`` does not wake the stub while it has a batch in flight and runs one batch at a time
(not decoupled): it reads its ring before it sleeps again, so the wake-up would be wasted. The
bell it did not ring is owed until the batch is answered (:meth:`StubOutputs.settle`): a stub
that had already gone to sleep then wakes and frees the blocks (docs/ipc.md, "Wake-ups").

A stub that exits leaves answers in its ring that it wrote whole: they are still delivered
(``UpMessages.last_words``), their blocks read in place in the dead stub's arena. The arena is
let go (its mappings closed, the frontend workers told to drop it) only once those answers have
been written and released (:meth:`StubOutputs.keep`, :meth:`StubOutputs.after_answers`).
"""

from __future__ import annotations

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


class Batches(Protocol):
    """What the stub has in flight (the instance's ``InFlightLedger``)."""

    #: Set while no batch is inside the stub.
    idle: Flag
    #: How many batches the stub runs at once.
    limit: int


class _Kept:
    """The blocks of a dead stub's last answers still out, and what waits for their return."""

    def __init__(self) -> None:
        self.blocks: set[Block] = set()
        self.then: list[Callable[[], None]] = []


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
        #: Exited stubs whose last answers hold blocks of their arena, by ``id`` of the stub.
        self._kept: dict[int, _Kept] = {}

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
                self._pending.append(block)
            elif self._kept:  # an exited stub's: nothing to send, its arena may go
                self._returned(proc, block)
        if self._pending and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def drop(self, proc: StubChannel, response: msg.ResponseRecord) -> None:
        """Give back at once what a response nobody will read holds."""
        self.release_outputs(proc, owned_outputs(proc, response))
        if self._cuda.lent_count:
            self.release_cuda(self.adopt_cuda(proc, response))

    def forget(self) -> None:
        """The stub died: its output arena goes with it, nothing is left to give back."""
        self._pending.clear()
        self._owed = None

    def keep(self, proc: StubChannel, blocks: list[Block]) -> None:
        """``proc`` exited and its last answers, delivered now, hold ``blocks`` of its arena:
        the arena stays mapped until they come back (:meth:`after_answers`)."""
        if blocks:
            self._kept.setdefault(id(proc), _Kept()).blocks.update(blocks)

    def after_answers(self, proc: StubChannel, then: Callable[[], None]) -> None:
        """Call ``then`` once the blocks kept of the exited ``proc`` have come back: now if
        none is out."""
        kept = self._kept.get(id(proc))
        if kept is None:
            then()
        else:
            kept.then.append(then)

    def _returned(self, proc: StubChannel, block: Block) -> None:
        kept = self._kept.get(id(proc))
        if kept is None:
            return
        kept.blocks.discard(block)
        if not kept.blocks:
            del self._kept[id(proc)]
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


def lent_blocks(proc: StubChannel, message: msg.Message) -> list[Block]:
    """The blocks of ``proc``'s arena an answer (a Result or a Response) hands on."""
    if type(message) is msg.Response:
        body = message.response
        return [] if body is None else owned_outputs(proc, body)
    if type(message) is msg.Result:
        return [b for record in message.responses for b in owned_outputs(proc, record)]
    return []


def owned_outputs(proc: StubChannel, response: msg.ResponseRecord) -> list[Block]:
    """The blocks of ``proc``'s output arena a response's outputs lie in."""
    return [b for b in response_blocks(response) if b.arena_id == proc.output_arena_id]
