"""The marker a coroutine stepped by hand ends on, in place of returning.

Both hand-stepped kinds of work await it last: the HTTP fast path's requests
(``http/_fast_request.Stepped``) and gRPC ModelInfer calls (``grpc/native_context.CallWork``).
The step that yields it ends the work, which is dropped and never resumed. A coroutine that
returns raises StopIteration to whoever steps it, and compiled, catching that costs ~4,000
instructions a request (the traceback entry, the exception state saved and restored). Never
await it inside ``try``/``finally``, ``with`` or ``async with``: compiled (mypyc), a dropped
coroutine never runs their cleanup.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final


class _LastStep:
    """:data:`LAST_STEP`'s class."""

    def __await__(self) -> Generator[Any, None, None]:
        yield self


#: Awaited last by a coroutine stepped by hand: its step yields this, and ends it.
LAST_STEP: Final = _LastStep()
