"""Requests answered through a callback rather than awaited: the frontend workers' link.

A coroutine and a task per request cost the core more than the rest of a small request's path
(docs/perf.md, "The core's CPU per request"); :meth:`InferenceService.start_infer` answers
through ``done`` from the completion's own callback, and the paths that keep a coroutine (an
ensemble, a decoupled model, the response cache) run it in a task that calls ``done``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from shoal.core.types import InferResponse

#: Called once with (response, None) or (None, the error; CancelledError when cancelled).
Answer = Callable[[InferResponse | None, BaseException | None], None]


def nothing() -> None:
    """Cancels a request that was answered already."""


def in_task(call: Coroutine[Any, Any, InferResponse], done: Answer) -> Callable[[], object]:
    """Run ``call`` in a task that answers through ``done``; returns what cancels it."""
    task = asyncio.ensure_future(call)

    def finished(task: asyncio.Future[InferResponse]) -> None:
        if task.cancelled():
            done(None, asyncio.CancelledError())
        elif (error := task.exception()) is not None:
            done(None, error)
        else:
            done(task.result(), None)

    task.add_done_callback(finished)
    return task.cancel
