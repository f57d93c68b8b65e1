"""Cancels that reach a stub before their request starts, from the core and from workers."""

from __future__ import annotations

import pytest

from shoal.ipc import messages as msg
from shoal.stub.open_requests import SENDER_SHIFT, CancelFlag, OpenRequests

pytestmark = pytest.mark.timeout(10)


def _record(key: int) -> msg.RequestRecord:
    return msg.RequestRecord("", 0, 0, {}, [], [], key=key)


def test_an_early_cancel_from_the_core_holds_after_a_workers_larger_keys() -> None:
    """A worker's keys carry its number above bit 40; a Cancel of the core's next request
    (key 3) must still be remembered once a worker's request (a far larger key) started."""
    open_requests = OpenRequests()
    worker_key = (1 << SENDER_SHIFT) | 7
    assert open_requests.track([_record(2)], [CancelFlag()]) == 0
    assert open_requests.track([_record(worker_key)], [CancelFlag()]) == 0
    open_requests.cancel([3, worker_key + 1])  # neither has started
    late_core, late_worker = CancelFlag(), CancelFlag()
    assert open_requests.track([_record(3)], [late_core]) == 1
    assert open_requests.track([_record(worker_key + 1)], [late_worker]) == 1
    assert late_core.cancelled and late_worker.cancelled


def test_a_cancel_of_a_key_already_seen_is_not_kept() -> None:
    open_requests = OpenRequests()
    open_requests.track([_record(5)], [CancelFlag()])
    open_requests.untrack([5])
    open_requests.cancel([4])  # answered long ago: nothing to remember
    assert open_requests.track([_record(4)], [CancelFlag()]) == 0


def test_an_untracked_batch_is_not_cancelled_by_a_late_cancel() -> None:
    """``untrack_records`` forgets a finished batch's flags: a Cancel that comes after sets
    nothing and is not remembered (its keys were seen)."""
    open_requests = OpenRequests()
    first, second = CancelFlag(), CancelFlag()
    records = [_record(8), _record(9)]
    assert open_requests.track(records, [first, second]) == 0
    open_requests.untrack_records(records)
    open_requests.cancel([8, 9])
    assert not first.cancelled and not second.cancelled
    assert open_requests.track([_record(9)], [CancelFlag()]) == 0
