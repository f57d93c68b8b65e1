"""The dynamic batcher's priority queue, on its own."""

from __future__ import annotations

import pytest

from shoal.config import QueuePolicy
from shoal.ipc.records import RequestRecord
from shoal.supervisor.promise import Promise, Settled
from shoal.supervisor.schedulers._queues import Entry, PriorityQueue
from shoal.supervisor.work import Work

pytestmark = pytest.mark.timeout(10)


def _queue_of(placed: list[tuple[str, int, bool]]) -> PriorityQueue:
    """Requests named by ``work``, each at a level, waiting or delayed (behind the waiting)."""
    queue = PriorityQueue(2, 1, QueuePolicy(), {})
    for name, level, delayed in placed:
        record = RequestRecord(name, 0, 0, {}, [], [], 0)
        entry = Entry(Work(record, [], Promise(Settled())), 0, 0, 1, None, level)
        part = queue.queue(level)
        (part.delayed if delayed else part.waiting).append(entry)
    return queue


def test_remove_first_takes_the_front_of_the_order_across_parts_and_levels():
    queue = _queue_of(
        [("d1", 1, True), ("a", 1, False), ("b", 1, False), ("c", 2, False), ("d2", 2, True)]
    )
    assert [e.work.record.request_id for e in queue] == ["a", "b", "d1", "c", "d2"]
    queue.remove_first(4)
    assert [e.work.record.request_id for e in queue] == ["d2"]
    queue.remove_first(1)
    assert len(queue) == 0


def test_remove_first_of_part_of_a_level_leaves_the_rest_in_order():
    queue = _queue_of([("a", 2, False), ("b", 2, False), ("c", 2, False)])
    queue.remove_first(2)
    assert [e.work.record.request_id for e in queue] == ["c"]


def test_the_largest_priority_levels_builds_at_once_and_serves_levels_in_order():
    # Triton's own queue test configures priority_levels 2**64-1: a queue per level would never
    # finish building.
    queue = PriorityQueue(2**64 - 1, 2**32, QueuePolicy(), {})
    for name, level in [("low", 2**63), ("default", queue.level_of(0)), ("high", 1)]:
        record = RequestRecord(name, 0, 0, {}, [], [], 0)
        queue.queue(level).waiting.append(
            Entry(Work(record, [], Promise(Settled())), 0, 0, 1, None, level)
        )
    assert [e.work.record.request_id for e in queue] == ["high", "default", "low"]


def test_levels_emptied_by_cuts_leave_nothing_behind_but_configured_ones_stay():
    policies = {3: QueuePolicy(max_queue_size=1)}
    queue = PriorityQueue(1000, 1, QueuePolicy(), policies)
    levels = list(range(1, 1000, 7))
    for level in levels:
        record = RequestRecord(str(level), 0, 0, {}, [], [], 0)
        queue.queue(level).waiting.append(
            Entry(Work(record, [], Promise(Settled())), 0, 0, 1, None, level)
        )
    queue.remove_first(len(levels) - 1)
    assert [e.work.record.request_id for e in queue] == [str(levels[-1])]
    assert queue.held_levels == [3, levels[-1]]
    queue.drain()
    assert queue.held_levels == [3]
    assert queue.queue(3).max_queue_size == 1
