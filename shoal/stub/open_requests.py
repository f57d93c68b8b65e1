"""The cancellation flags of the requests in a stub, by key, and Cancels that came early."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

from shoal.ipc import messages as msg

#: Where a request's key holds its sender's number (``frontends/workers/direct.py``).
# Final: compiled, a plain module constant is a dict look-up on every use.
SENDER_SHIFT: Final = 40


#: What ``CancelFlag.is_set`` calls first (``pb_utils._set_cancel_poller``): it takes in the
#: Cancels that arrived while the model was busy (Triton's ``is_cancelled`` asks the server).
_poller: Callable[[], None] | None = None


def set_cancel_poller(poller: Callable[[], None] | None) -> None:
    """Install (or with ``None`` remove) what :meth:`CancelFlag.is_set` calls first."""
    global _poller
    _poller = poller


class CancelFlag:
    """One request's cancellation: set when its client went away. A request, its response
    sender and :class:`OpenRequests` share it; nothing in it refers back to the request.

    A native class (this module is compiled): one is made per request served, for a fraction
    of what an interpreted one costs.
    """

    def __init__(self) -> None:
        self.cancelled = False

    def is_set(self) -> bool:
        if not self.cancelled:
            poller = _poller
            if poller is not None:
                poller()
        return self.cancelled


class CallingRequests:
    """The batch whose plain (not ``async def``) ``execute`` runs now, for BLS
    (``bls.current_callers``): a BLS call made while serving requests is cancelled with them.

    A ``contextvars.ContextVar`` set and reset around every execute costs ~2k instructions per
    batch (two HAMT updates, a token, the tuple of callers); most models never make a BLS call.
    So the executor writes the batch here (three native attribute stores) and BLS reads it on the
    thread that runs execute, while it runs. The context variable is still what a copied
    context carries: once the model has built a BLS request (``exact``, set by
    ``InferenceRequest.__init__``), and for every ``async def execute``, the executor sets it as
    before, so tasks and threads that copy the context keep their own batch's callers.
    """

    def __init__(self) -> None:
        self.records: list[msg.RequestRecord] = []
        self.flags: list[CancelFlag] = []
        #: The thread that runs ``execute`` (``threading.get_ident()``); 0 when none runs.
        self.thread = 0
        #: True once the model built a request for a BLS call: callers go in the context too.
        self.exact = False

    def callers_here(self, thread: int) -> tuple[tuple[int, CancelFlag], ...]:
        """The running batch's ``(key, flag)`` pairs, when asked on the thread running it."""
        if thread != self.thread:
            return ()
        records, flags = self.records, self.flags
        return tuple([(records[i].key, flags[i]) for i in range(len(records))])


#: The one per stub (a stub serves one model instance).
CALLING: Final = CallingRequests()


class OpenRequests:
    """Which requests are in the stub, so that a ``Cancel`` from the supervisor reaches them.

    Only their cancellation flags are kept, not the requests: no reference here may keep a
    request's input views alive.
    """

    def __init__(self) -> None:
        self._flags: dict[int, CancelFlag] = {}
        self._lock = threading.Lock()
        # Bound once: compiled, ``lock.acquire()`` looks the method up on every call (~250
        # instructions a batch more).
        self._acquire: Callable[[], object] = self._lock.acquire
        self._release: Callable[[], object] = self._lock.release
        # Each sender hands keys out in increasing order (the core from 1, a frontend worker
        # sending directly with its number above bit 40). A Cancel for a key above every key
        # seen from its sender is for a request sent ahead and not yet started: it is
        # remembered until that request starts (so the set only holds requests in a ring).
        self._newest: dict[int, int] = {}
        self._cancelled_early: set[int] = set()

    def cancel(self, keys: list[int]) -> None:
        """The supervisor says these requests' clients went away (any thread)."""
        with self._lock:
            flags: list[CancelFlag | None] = [self._flags.get(key) for key in keys]
            self._remember_early(keys, flags)
        for flag in flags:
            if flag is not None:
                flag.cancelled = True

    def _remember_early(self, keys: list[int], flags: list[CancelFlag | None]) -> None:
        """Cancels of requests not started yet, kept until they start (under the lock)."""
        self._cancelled_early.update(
            key
            for key, flag in zip(keys, flags, strict=True)
            if flag is None and key > self._newest.get(key >> SENDER_SHIFT, 0)
        )

    def track(self, records: list[msg.RequestRecord], batch_flags: list[CancelFlag]) -> int:
        """Track a batch's requests by their flags (one per record); returns how many of them
        were cancelled already."""
        cancelled = 0
        flags, newest = self._flags, self._newest
        # acquire and release, not ``with``: compiled, a with statement looks up and calls
        # __enter__ and __exit__ generically (~1.1k instructions a batch, ~500 more).
        self._acquire()
        try:
            for i in range(len(records)):  # indexed: zip(strict=True) costs ~2k in mypyc
                key = records[i].key
                flag = batch_flags[i]
                flags[key] = flag
                sender = key >> SENDER_SHIFT
                if key > newest.get(sender, 0):
                    newest[sender] = key
                if self._cancelled_early and key in self._cancelled_early:
                    self._cancelled_early.discard(key)
                    flag.cancelled = True
                    cancelled += 1
        finally:
            self._release()
        return cancelled

    # Untracking takes no lock: it only removes keys, each in one dict operation (atomic under
    # the GIL), and a Cancel that finds a key gone finds it at or below its sender's newest
    # key (``track`` set that first), so it does not remember it as early: the outcome is the
    # same whichever comes first. ``del``, not ``pop(key, None)``: compiled, that is a generic
    # method call (~600 instructions); a key already gone is rare (a decoupled request's final
    # response untracked it).

    def untrack(self, keys: list[int]) -> None:
        flags = self._flags
        for key in keys:
            try:
                del flags[key]
            except KeyError:
                pass

    def untrack_records(self, records: list[msg.RequestRecord]) -> None:
        """:meth:`untrack` of a batch's records, without building a list of their keys."""
        flags = self._flags
        for i in range(len(records)):
            try:
                del flags[records[i].key]
            except KeyError:
                pass


def batch_callers(
    records: list[msg.RequestRecord], flags: list[CancelFlag]
) -> tuple[tuple[int, Any], ...]:
    """The batch's ``(key, flag)`` pairs, for ``bls.calling_requests``."""
    # Indexed, not zip(strict=True): a keyword call of the builtin in compiled code costs ~2k
    # instructions (the lists are of one length: one flag per record).
    return tuple([(records[i].key, flags[i]) for i in range(len(records))])
