"""A coroutine stepped by hand in place of an :class:`asyncio.Task`: the one stepping that the
HTTP fast path's requests (``http/_fast_request.Stepped``) and gRPC ModelInfer calls
(``grpc/native_context.CallWork``) share."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final

from shoal.frontends._last_step import LAST_STEP

#: ``asyncio.get_running_loop`` and ``asyncio.CancelledError``, read once: compiled,
#: ``asyncio.X`` is an attribute look-up on the module at every use; a Final is a C static.
_running_loop: Final = asyncio.get_running_loop
_Cancelled: Final = asyncio.CancelledError


class SteppedWork:
    """Work (a coroutine) stepped by hand: no Task is made, named, registered or scheduled.

    Its first step runs at once (:meth:`_begin`); each later one from the done callback of the
    future it awaits, as a task's would. Cancellation is a task's (:meth:`_cancel_work`): the
    future awaited is cancelled, so the work sees CancelledError there, or, between steps,
    the next step throws it. A bare ``yield`` (``asyncio.sleep(0)``) steps again on the loop's
    next turn; a yield of anything else is thrown back as a RuntimeError, as a task would.
    The work ends by awaiting :data:`LAST_STEP` (or by returning, which costs a StopIteration
    caught); then, or when an exception comes out of it, :meth:`_work_over` is told once.
    What it does not do: it is not ``asyncio.current_task()`` (nothing on the stepped paths
    asks; ``asyncio.timeout`` would), and its steps run in the loop's context, not a copy.
    """

    _work: Coroutine[Any, Any, None] | None = None  # the work, while it runs
    _waiter: asyncio.Future[Any] | None = None  # what it awaits
    _must_cancel = False  # its next step throws CancelledError

    def _work_over(self, error: BaseException | None) -> None:
        """The work has ended and is let go: by its last step (``error`` None), or by an
        exception out of it (a CancelledError, as a cancelled task's; any other is a bug)."""

    def _begin(self, work: Coroutine[Any, Any, None]) -> None:
        """Step ``work``, its first step now."""
        self._work = work
        self._step(None)

    def _cancel_work(self, msg: Any = None) -> None:
        """As :meth:`asyncio.Task.cancel`: the future awaited is cancelled, or the next step
        throws CancelledError."""
        waiter = self._waiter
        if waiter is None or not waiter.cancel(msg):
            self._must_cancel = True

    def _step(self, error: BaseException | None) -> None:
        """One step of the work, up to its next await."""
        work = self._work
        if work is None:
            return
        try:
            if error is not None:
                awaited = work.throw(error)
            elif self._must_cancel:
                self._must_cancel = False
                awaited = work.throw(_Cancelled())
            else:
                awaited = work.send(None)
        except StopIteration:  # it returned
            self._work = None
            self._work_over(None)
            return
        except BaseException as exc:  # CancelledError, as a task's; any other is a bug
            self._work = None
            self._work_over(exc)
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise  # KeyboardInterrupt, SystemExit: as a task, to the loop
            return
        if awaited is LAST_STEP:  # done: the coroutine is dropped, never resumed
            self._work = None
            self._work_over(None)
        elif awaited is None:  # a bare yield: again on the loop's next turn
            _running_loop().call_soon(self._step, None)
        elif getattr(awaited, "_asyncio_future_blocking", False):
            awaited._asyncio_future_blocking = False
            self._waiter = awaited
            # A bound method made per await, not kept: kept, the work's owner would be a
            # reference cycle (it, its method, it), garbage only the collector frees.
            awaited.add_done_callback(self._woken)
            if self._must_cancel and awaited.cancel():
                self._must_cancel = False
        else:  # as a task would, it hears that it yielded what it may not
            error = RuntimeError(f"stepped work yielded {awaited!r}, not a future")
            _running_loop().call_soon(self._step, error)

    def _woken(self, future: asyncio.Future[Any]) -> None:
        """The future the work awaits is done: its next step (the await reads it)."""
        self._waiter = None
        self._step(None)
