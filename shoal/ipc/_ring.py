"""A single-producer/single-consumer byte ring inside a shared control segment.

Layout of one ring's header (each word on its own cache line so the two sides never write the
same line):

* ``tail``: bytes ever written; only the producer stores it.
* ``head``: bytes ever consumed; only the consumer stores it.
* ``sleep``: 0 while the consumer is awake, else the number of its current sleep episode.
* ``wait``: 0 while the producer is not waiting for space, else its wait-episode number; beside
  it ``want``, the free bytes at which the waiting producer wants its doorbell rung.

``tail`` and ``head`` increase monotonically as 64-bit counters; a position in the data area is
``counter & (capacity - 1)``. Each record is an 8-byte length word then the payload, padded to a
multiple of 8 so that length words never straddle the end; payloads may wrap around it.

Every shared word is read and written as one aligned 8-byte item of a ``'Q'`` memoryview, i.e. a
single load or store. Publication order relies on x86-64's total store order: the payload bytes
are stored before ``tail``, and the consumer loads ``tail`` before the payload. The one reordering
TSO allows (a store followed by a load of another word) is closed with :meth:`Ring.fence` where the
wake-up protocol needs it (docs/ipc.md, "Wake-ups").
"""

from __future__ import annotations

import threading
from typing import Final

from shoal.ipc._errors import RingCorrupted

HEADER_BYTES: Final = 512
# Word offsets from the header start; the four owners' words sit 64 bytes apart.
_TAIL, _HEAD, _SLEEP, _WAIT, _WANT = 0, 8, 16, 24, 25
_LENGTH_WORD: Final = 8


def record_size(nbytes: int) -> int:
    return _LENGTH_WORD + ((nbytes + 7) & ~7)


class Ring:
    """Both ends of one ring; a process uses the producer half or the consumer half, never both."""

    def __init__(self, words: memoryview, header_word: int, data: memoryview) -> None:
        self._words = words  # the whole control segment as 'Q'
        self._data = data  # this ring's data area as bytes
        self._data_words = data.cast("Q")
        self.capacity = len(data)
        if self.capacity & (self.capacity - 1) or self.capacity < 64:
            raise ValueError(f"ring capacity must be a power of two >= 64, got {self.capacity}")
        self._mask = self.capacity - 1
        self._tail_i = header_word + _TAIL
        self._head_i = header_word + _HEAD
        self._sleep_i = header_word + _SLEEP
        self._wait_i = header_word + _WAIT
        self._want_i = header_word + _WANT
        # Each side caches its own counter and the last value it saw of the other side's, so the
        # shared line is only read when the cached value says the ring is full or empty.
        self._tail = words[self._tail_i]
        self._head = words[self._head_i]
        self._seen_head = self._head
        self._seen_tail = self._tail
        self._episode = max(words[self._sleep_i], words[self._wait_i])
        self._rung_sleep = 0
        self._rung_wait = 0
        self._fence_lock = threading.Lock()

    def fence(self) -> None:
        """A full memory barrier: our earlier stores are visible before our later loads.

        Taking and releasing a lock is an atomic read-modify-write, which x86-64 executes as a
        LOCK-prefixed instruction: a full fence, and the only one pure Python can issue.
        """
        self._fence_lock.acquire()
        self._fence_lock.release()

    def release(self) -> None:
        self._data_words.release()
        self._data.release()

    # producer half

    def max_payload(self) -> int:
        return self.capacity - _LENGTH_WORD

    def try_write(self, payload: bytes) -> bool:
        """Append one record; False when the ring lacks room right now."""
        size = len(payload)
        need = _LENGTH_WORD + ((size + 7) & ~7)
        tail = self._tail
        if tail + need - self._seen_head > self.capacity:
            if need > self.capacity:
                raise ValueError(
                    f"message of {size} bytes exceeds the ring capacity ({self.capacity} bytes, "
                    f"at most {self.max_payload()} of payload)"
                )
            self._seen_head = self._words[self._head_i]
            if tail + need - self._seen_head > self.capacity:
                return False
        pos = tail & self._mask
        self._data_words[pos >> 3] = size
        start = (pos + _LENGTH_WORD) & self._mask
        first = self.capacity - start
        if size <= first:
            self._data[start : start + size] = payload
        else:
            view = memoryview(payload)
            self._data[start:] = view[:first]
            self._data[: size - first] = view[first:]
        self._tail = tail + need
        self._words[self._tail_i] = self._tail
        return True

    def has_room(self, size: int) -> bool:
        self._seen_head = self._words[self._head_i]
        return self._tail + record_size(size) - self._seen_head <= self.capacity

    def consumer_wants_bell(self) -> bool:
        """After a publish: True once per consumer sleep episode, when the bell must ring."""
        self._fence_lock.acquire()  # fence(), inlined: the tail store must precede this load
        self._fence_lock.release()
        episode = self._words[self._sleep_i]
        if episode and episode != self._rung_sleep:
            self._rung_sleep = episode
            return True
        return False

    def begin_wait(self, size: int) -> None:
        """Announce a wait for room for a ``size``-byte message (re-check before sleeping).

        The doorbell is wanted only once half the ring (or the message, if larger) is free, so a
        saturated pipeline wakes the producer once per half ring rather than once per message.
        """
        self._words[self._want_i] = min(self.capacity, max(record_size(size), self.capacity // 2))
        self._episode += 1
        self._words[self._wait_i] = self._episode
        self.fence()

    def end_wait(self) -> None:
        self._words[self._wait_i] = 0

    # consumer half

    def try_read(self) -> bytes | None:
        head = self._head
        if head == self._seen_tail:
            self._seen_tail = self._words[self._tail_i]
            if head == self._seen_tail:
                return None
        pos = head & self._mask
        size = self._data_words[pos >> 3]
        if size > self.capacity - _LENGTH_WORD or head + record_size(size) > self._seen_tail:
            raise RingCorrupted(f"record at {head} claims {size} bytes (ring {self.capacity})")
        start = (pos + _LENGTH_WORD) & self._mask
        end = start + size
        if end <= self.capacity:
            out = self._data[start:end].tobytes()
        else:
            out = self._data[start:].tobytes() + self._data[: end - self.capacity].tobytes()
        self._head = head + _LENGTH_WORD + ((size + 7) & ~7)
        self._words[self._head_i] = self._head
        return out

    def is_empty(self) -> bool:
        self._seen_tail = self._words[self._tail_i]
        return self._head == self._seen_tail

    def producer_wants_bell(self) -> bool:
        """After a consume: True once per producer wait episode, when the bell must ring."""
        episode = self._words[self._wait_i]
        if not episode or episode == self._rung_wait:
            return False
        # _seen_tail never runs ahead of the real tail, so this never under-counts the room.
        if self.capacity - (self._seen_tail - self._head) < self._words[self._want_i]:
            return False
        self._rung_wait = episode
        return True

    def begin_sleep(self) -> None:
        """Announce a sleep; the caller must look at the ring once more before sleeping."""
        self._episode += 1
        self._words[self._sleep_i] = self._episode
        self.fence()

    def end_sleep(self) -> None:
        self._words[self._sleep_i] = 0
