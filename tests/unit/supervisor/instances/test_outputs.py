"""Where completions' blocks go back, over loopback stubs: one Release per loop turn, nothing to
a stub that died."""

from __future__ import annotations

import asyncio

import pytest

from shoal.ipc import messages as msg
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
