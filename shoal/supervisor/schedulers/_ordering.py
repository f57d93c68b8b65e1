"""``preserve_ordering``: responses reach requesters in the order their requests left the queue.

With several instances a later batch can finish first. At dispatch each work's future is swapped
for an inner one that the instance completes; completions are then passed on to the requesters'
futures strictly in dispatch order. A requester that went away meanwhile gets nothing and the
completion's blocks are released.
"""

from __future__ import annotations

import asyncio
import collections

from shoal.supervisor.promise import Promise
from shoal.supervisor.work import Completion, Work

#: A requester's side of a work (``Work.future``).
_Requester = asyncio.Future[Completion] | Promise


class OrderedDelivery:
    """Holds completions back until every earlier dispatched request has completed."""

    def __init__(self) -> None:
        self._order: collections.deque[tuple[_Requester, asyncio.Future[Completion]]]
        self._order = collections.deque()

    def track(self, work: Work) -> None:
        """Call when ``work`` leaves the queue for an instance."""
        requester = work.future
        inner: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        work.future = inner
        self._order.append((requester, inner))
        inner.add_done_callback(lambda _: self._flush())

    def _flush(self) -> None:
        while self._order and self._order[0][1].done():
            requester, inner = self._order.popleft()
            _pass_on(requester, inner)


def _pass_on(requester: _Requester, inner: asyncio.Future[Completion]) -> None:
    if inner.cancelled():
        requester.cancel()
        return
    error = inner.exception()
    if error is not None:
        if not requester.done():
            requester.set_exception(error)
        return
    completion = inner.result()
    if requester.done():  # the client went away: nobody will release the outputs
        completion.release()
    else:
        requester.set_result(completion)
