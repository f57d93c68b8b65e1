"""The model's own ``is_ready()`` (Triton's user-defined model readiness).

Each check runs on a thread of its own, so a slow ``is_ready()`` holds up neither ``execute``
nor the stub's main loop; an ``async def is_ready`` runs on the model's event loop.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.queue import PeerGone


def defines_is_ready(model: Any) -> bool:
    return callable(getattr(model, "is_ready", None))


def start_check(
    model: Any, run_coroutine: Callable[[Any], Any], send: Callable[[msg.Message], None]
) -> None:
    """Run ``model.is_ready()`` now, on a new thread; its answer goes up as ``Readiness``."""
    threading.Thread(
        target=_check, args=(model, run_coroutine, send), name="is-ready", daemon=True
    ).start()


def _check(
    model: Any, run_coroutine: Callable[[Any], Any], send: Callable[[msg.Message], None]
) -> None:
    try:
        result = model.is_ready()
        if inspect.isawaitable(result):
            result = run_coroutine(result)
        if isinstance(result, bool):
            answer = msg.Readiness(result)
        else:  # Triton's words
            answer = msg.Readiness(False, "is_ready() must return a boolean value")
    except Exception as error:
        answer = msg.Readiness(False, f"{type(error).__name__}: {error}")
    try:
        send(answer)
    except PeerGone:
        pass  # the supervisor is gone
