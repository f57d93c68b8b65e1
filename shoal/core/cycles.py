"""Collect reference cycles soon after the arena of a stub that exited was let go.

A view of a block (a ``memoryview``, a NumPy array over it) keeps its segment's pages mapped
after the segment is closed, until the view is collected (``Segment.close``). Views caught in
reference cycles (an exception's traceback and the frames it holds, say) live until the cyclic
collector's next full pass, which an idle server may not run for minutes: the dead stub's arena
stayed mapped in the core and the workers (seen in the stub-death sweep, issue 25). One full
collection a moment after the exit lets it go; exits in a burst (an unload of many instances)
share one.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Final

#: Seconds from the first exit of a burst to the collection.
COLLECT_AFTER_S: Final = 0.5

_pending: set[asyncio.AbstractEventLoop] = set()


def collect_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Run one full collection on ``loop`` in :data:`COLLECT_AFTER_S` (one per burst)."""
    if loop in _pending:
        return
    _pending.add(loop)
    loop.call_later(COLLECT_AFTER_S, _collect, loop)


def _collect(loop: asyncio.AbstractEventLoop) -> None:
    _pending.discard(loop)
    gc.collect()
