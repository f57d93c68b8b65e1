"""A dead stub's arena is let go although views of it are caught in reference cycles."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from shoal.core.cycles import COLLECT_AFTER_S, collect_soon

pytestmark = pytest.mark.timeout(10)


class Holder:
    """Stands for what holds a view in a cycle (an exception's traceback and its frames)."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(64))
        self.me = self


def test_views_in_cycles_are_collected_once_soon_after_exits():
    async def scenario() -> None:
        gc.disable()  # the collector must not run by itself meanwhile
        try:
            holders = [Holder() for _ in range(2)]
            gone = [weakref.ref(holder) for holder in holders]
            del holders
            loop = asyncio.get_running_loop()
            started = loop.time()
            collect_soon(loop)
            collect_soon(loop)  # a burst of exits: one collection
            assert all(ref() is not None for ref in gone)
            while any(ref() is not None for ref in gone):
                assert loop.time() - started < COLLECT_AFTER_S + 5, "never collected"
                await asyncio.sleep(0.01)  # polling the collection, scheduled on this loop
        finally:
            gc.enable()

    asyncio.run(scenario())
