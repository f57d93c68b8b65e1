"""The dynamic batcher's queue: priority levels, each with its queue policy (Triton's
``PriorityQueue`` / ``PolicyQueue``).

Levels are served lowest number first. Within a level, requests wait in arrival order; a request
whose queue timeout expires is rejected (``REJECT``) or moved behind the level's unexpired
requests (``DELAY``), where it stays without a deadline.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shoal.config import QueuePolicy
from shoal.supervisor.work import Work


@dataclass(eq=False)
class Entry:
    """One queued request with what batch formation reads."""

    work: Work
    arrival_ns: int
    #: When the queue policy acts on it (0: never).
    deadline_ns: int
    #: Inferences it adds to a batch (its first dimension, at least 1).
    size: int
    #: Requests share a batch only when their keys are equal (see ``_batching.shape_key``).
    shape_key: Any  # not ``object``: mypyc's dataclass fails at import on that name
    #: Its priority level.
    level: int = 0

    def __init__(
        self,
        work: Work,
        arrival_ns: int,
        deadline_ns: int,
        size: int,
        shape_key: Any,
        level: int = 0,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.work = work
        self.arrival_ns = arrival_ns
        self.deadline_ns = deadline_ns
        self.size = size
        self.shape_key = shape_key
        self.level = level


class PolicyQueue:
    """The requests of one priority level."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        # The policy's figures read per request, as native attributes (a QueuePolicy is a
        # frozen dataclass: each read of it is a generic look-up, compiled).
        self.max_queue_size: int = policy.max_queue_size
        self._default_timeout_us: int = policy.default_timeout_microseconds
        self._allow_override: bool = policy.allow_timeout_override
        self.waiting: collections.deque[Entry] = collections.deque()
        self.delayed: collections.deque[Entry] = collections.deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)

    def timeout_us(self, requested_us: int) -> int:
        """The timeout a request gets: the default, or a shorter one it asked for if allowed."""
        timeout = self._default_timeout_us
        if self._allow_override and 0 < requested_us < timeout:
            timeout = requested_us
        return timeout

    @property
    def gives_deadlines(self) -> bool:
        """Whether :meth:`timeout_us` can give a request a timeout at all."""
        return self.policy.default_timeout_microseconds > 0

    def expire(self, now_ns: int) -> list[Entry]:
        """Apply the policy to every expired request; returns the rejected ones."""
        expired = [e for e in self.waiting if e.deadline_ns and now_ns > e.deadline_ns]
        if not expired:
            return []
        gone = {id(e) for e in expired}
        self.waiting = collections.deque(e for e in self.waiting if id(e) not in gone)
        if self.policy.timeout_action == "DELAY":
            for entry in expired:
                entry.deadline_ns = 0
            self.delayed.extend(expired)
            return []
        return expired

    def __iter__(self) -> Iterator[Entry]:
        yield from self.waiting
        yield from self.delayed

    def remove_first(self, count: int) -> int:
        """Remove up to ``count`` requests from the front of :meth:`__iter__`'s order; returns
        how many are left to remove (from the next level)."""
        for part in (self.waiting, self.delayed):
            while count and part:
                part.popleft()
                count -= 1
        return count

    def remove(self, entry: Entry) -> None:
        if entry in self.waiting:
            self.waiting.remove(entry)
        else:
            self.delayed.remove(entry)


class PriorityQueue:
    """Priority levels ``1..levels`` (or one level ``0``), each a :class:`PolicyQueue`."""

    def __init__(
        self,
        levels: int,
        default_level: int,
        default_policy: QueuePolicy,
        level_policies: dict[int, QueuePolicy],
    ) -> None:
        self.levels = levels
        self.default_level = default_level if levels else 0
        self._default_policy = default_policy
        self._policies = level_policies
        self._queues: dict[int, PolicyQueue] = {}
        #: The levels that have a queue, ascending, and their queues in that order (the order
        #: they are served).
        self._numbers: list[int] = []
        self._ordered: list[PolicyQueue] = []
        # Levels without timeouts need no scan for the closest deadline on every request.
        self._timed: list[PolicyQueue] = []
        # As in Triton, only the levels a policy names are kept from the start; any other level
        # gets its queue with its first request and loses it when empty: priority_levels may be
        # 2**64-1, and a client sending many distinct priorities leaves nothing behind.
        for level in sorted(level_policies) if levels else [0]:
            self._add(level)

    def __len__(self) -> int:
        count = 0
        for queue in self._ordered:
            count += len(queue.waiting) + len(queue.delayed)
        return count

    def any_queued(self) -> bool:
        """Whether any request is queued (``len(self) > 0``, without counting them)."""
        # (compiled, any() over a generator expression is a plain loop: no generator object)
        return any(queue.waiting or queue.delayed for queue in self._ordered)

    def level_of(self, priority: int) -> int:
        """Triton's rule: priority 0 or one above the highest level means the default level."""
        if priority == 0 or priority > self.levels:
            return self.default_level
        return priority

    @property
    def held_levels(self) -> list[int]:
        """The levels that have a queue now, ascending."""
        return list(self._numbers)

    def queue(self, level: int) -> PolicyQueue:
        queue = self._queues.get(level)
        if queue is None:
            queue = self._add(level)
        return queue

    def _add(self, level: int) -> PolicyQueue:
        queue = PolicyQueue(self._policies.get(level, self._default_policy))
        index = bisect.bisect(self._numbers, level)
        self._numbers.insert(index, level)
        self._ordered.insert(index, queue)
        self._queues[level] = queue
        if queue.gives_deadlines:
            self._timed.append(queue)
        return queue

    def _prune(self) -> None:
        """Drop the queues of empty levels that no policy names."""
        if len(self._queues) <= len(self._policies) or not self.levels:
            return
        for index in range(len(self._numbers) - 1, -1, -1):
            level = self._numbers[index]
            queue = self._ordered[index]
            if level in self._policies or queue.waiting or queue.delayed:
                continue
            del self._numbers[index]
            del self._ordered[index]
            del self._queues[level]
            if queue in self._timed:
                self._timed.remove(queue)

    def __iter__(self) -> Iterator[Entry]:
        """Every queued request in the order batches take them."""
        for queue in self._ordered:
            yield from queue

    def expire(self, now_ns: int) -> list[Entry]:
        rejected: list[Entry] = []
        for queue in self._timed:  # only their requests have deadlines
            rejected += queue.expire(now_ns)
        if rejected:
            self._prune()
        return rejected

    def closest_deadline(self) -> int | None:
        deadlines = [e.deadline_ns for q in self._timed for e in q.waiting]
        live = [d for d in deadlines if d]
        return min(live) if live else None

    def remove_first(self, count: int) -> None:
        """Remove the first ``count`` requests in :meth:`__iter__`'s order (a cut takes them):
        pops, where removing each by value would search the queue for it."""
        for queue in self._ordered:
            count = queue.remove_first(count)
            if not count:
                break
        self._prune()

    def remove(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._queues[entry.level].remove(entry)
        if entries:
            self._prune()

    def drain(self) -> list[Entry]:
        entries = list(self)
        for queue in self._queues.values():
            queue.waiting.clear()
            queue.delayed.clear()
        self._prune()
        return entries
