"""Where completions' blocks go back, over loopback stubs: one Release per loop turn, nothing to
a stub that died."""

from __future__ import annotations

import asyncio

import pytest

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block, OwnedArena
from shoal.supervisor.instances.ledger import InFlightLedger
from shoal.supervisor.instances.outputs import StubOutputs
from shoal.supervisor.instances.spec import InstanceScope
from shoal.supervisor.memory.segments import SegmentDirectory
from tests.unit.supervisor.instances.helpers import Setup, run
from tests.unit.supervisor.schedulers.helpers import WAIT, settle

pytestmark = pytest.mark.timeout(10)


def _releases(stub) -> list[msg.Release]:
    return [m for m in stub.received if isinstance(m, msg.Release)]


def test_completions_released_in_one_loop_turn_go_back_in_one_release():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        works = [s.submit(float(i)) for i in range(3)]
        completions = [await asyncio.wait_for(w.future, WAIT) for w in works]
        assert s.stub.output_bytes_in_use > 0
        assert not _releases(s.stub)
        for completion in completions:
            completion.release()
        await settle()
        releases = _releases(s.stub)
        assert len(releases) == 1
        assert len(releases[0].blocks) == 3
        assert s.stub.output_bytes_in_use == 0
        await s.close()

    run(scenario())


@pytest.mark.timeout(60)  # 60k blocks take a second or two idle; CI's two cores are shared
def test_more_blocks_than_one_message_can_carry_go_back_in_several():
    """A client that hangs up on a long decoupled stream releases every response queued in it in
    one loop turn: more blocks than one Release can carry through the stub's ring (1 MiB)."""

    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        stub = s.stub
        blocks = [stub.output_block(8) for _ in range(60_000)]  # > 1 MiB in one Release
        s.instance.release_outputs(stub, blocks)
        await settle()
        releases = _releases(stub)
        assert len(releases) > 1
        assert sum(len(release.blocks) for release in releases) == len(blocks)
        assert stub.output_bytes_in_use == 0
        await s.close()

    run(scenario())


def test_a_completion_of_a_dead_stub_is_released_without_a_message():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        completion = await asyncio.wait_for(s.submit().future, WAIT)
        s.stub.kill()
        await s.restarted(2)
        completion.release()  # its stub's arena went with it
        await settle()
        assert not any(_releases(stub) for stub in s.kind.made)
        await s.close()

    run(scenario())


class RecordingStub:
    """A stub end that records what is sent to it and whether each send would ring its bell."""

    output_arena_id = 7
    returncode = None
    pid = 1

    def __init__(self) -> None:
        self.sent: list[tuple[msg.Message, bool]] = []
        self.wakes = 0

    def send(self, message: msg.Message, ring: bool = True) -> bool:
        self.sent.append((message, ring))
        return True

    def wake(self) -> None:
        self.wakes += 1


def _bell_parts(decoupled: bool = False, concurrency: int = 1):
    arena = OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20)
    scope = InstanceScope("m_0", SegmentDirectory(arena), lambda blocks: None)
    stub = RecordingStub()
    scope.current.proc = stub
    ledger = InFlightLedger(scope, None, False)
    ledger.configure(concurrency)
    outputs = StubOutputs(scope, None if decoupled else ledger)
    ledger.on_idle = outputs.settle
    return arena, stub, ledger, outputs


async def _release_one(outputs: StubOutputs, stub: RecordingStub) -> bool:
    """Release one output block; whether its ``Release`` rang the stub's bell."""
    outputs.release_outputs(stub, [Block(7, 0, 0, 64)])
    await asyncio.sleep(0)  # the flush runs on the next loop turn
    message, ring = stub.sent[-1]
    assert isinstance(message, msg.Release)
    return ring


def test_a_release_while_a_sync_batch_is_in_flight_rings_no_bell_until_it_is_answered():
    async def scenario():
        arena, stub, ledger, outputs = _bell_parts()
        batch_id = ledger.open([], ledger.slots, None)
        assert not await _release_one(outputs, stub)
        assert not await _release_one(outputs, stub)
        assert stub.wakes == 0
        ledger.done(stub, batch_id)  # answered: the stub may have gone to sleep meanwhile
        assert stub.wakes == 1
        assert await _release_one(outputs, stub)  # idle: ring at once
        ledger.open([], ledger.slots, None)
        ledger.done(stub, 2)
        assert stub.wakes == 1  # nothing was owed this time
        arena.close()

    run(scenario())


def test_a_release_rings_at_once_for_a_decoupled_or_concurrent_stub():
    async def scenario():
        for decoupled, concurrency in ((True, 1), (False, 2)):
            arena, stub, ledger, outputs = _bell_parts(decoupled, concurrency)
            ledger.open([], ledger.slots, None)
            assert await _release_one(outputs, stub)
            arena.close()

    run(scenario())


def test_a_stub_that_died_is_owed_no_wake_up():
    async def scenario():
        arena, stub, ledger, outputs = _bell_parts()
        batch_id = ledger.open([], ledger.slots, None)
        assert not await _release_one(outputs, stub)
        outputs.forget()
        ledger.done(stub, batch_id)
        assert stub.wakes == 0
        arena.close()

    run(scenario())


def test_a_dead_stubs_arena_is_let_go_once_the_answers_out_come_back():
    """Completions of a stub that exited still hold blocks of its arena: it stays mapped until
    every one is back, and nothing is sent to the dead stub."""

    async def scenario():
        arena, stub, _, outputs = _bell_parts()
        blocks = [Block(stub.output_arena_id, 0, index * 64, 64) for index in range(3)]
        outputs.lend(3)
        outputs.release_outputs(stub, blocks[:1])  # written while the stub lived
        await settle()
        stub.returncode = -9
        let_go: list[str] = []
        outputs.after_answers(stub, lambda: let_go.append("dead"))
        outputs.release_outputs(stub, blocks[1:2])
        assert let_go == []
        outputs.release_outputs(stub, blocks[2:])
        assert let_go == ["dead"]
        other = RecordingStub()
        other.returncode = -9
        outputs.after_answers(other, lambda: let_go.append("other"))  # nothing out: at once
        assert let_go == ["dead", "other"]
        await settle()
        assert [m for m, _ in stub.sent] == [msg.Release(blocks[:1])]
        arena.close()

    run(scenario())
