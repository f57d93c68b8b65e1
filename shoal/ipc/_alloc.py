"""Free-run bookkeeping for arenas, independent of any shared memory.

Runs are addressed by a single integer key ``segment << SEGMENT_SHIFT | offset`` so that a run that
ends at a segment's end can never be mistaken for the neighbour of the next segment's first run,
and so that the dictionaries below hash plain ints instead of tuples.

Free runs sit in segregated lists by size class (``floor(log2(size))``), each an insertion-ordered
dict used as a stack so that the most recently freed run (whose pages are warm) is reused first. A
bitmask of non-empty classes finds the smallest class that is guaranteed to fit in O(1), and two
boundary maps (start -> size, end -> start) make coalescing O(1). Every operation is O(1) apart from
a bounded look into the one class that may hold runs slightly too small.
"""

from __future__ import annotations

from typing import Final

ALIGN: Final = 64
SEGMENT_SHIFT: Final = 48
_OFFSET_MASK: Final = (1 << SEGMENT_SHIFT) - 1
_CLASSES: Final = 64
# How many of the most recent runs of the "may fit" class to try before moving to a larger class.
_NEAR_FIT_PROBES: Final = 4


def align_up(nbytes: int, alignment: int = ALIGN) -> int:
    return (nbytes + alignment - 1) // alignment * alignment


def make_key(segment: int, offset: int) -> int:
    return (segment << SEGMENT_SHIFT) | offset


def split_key(key: int) -> tuple[int, int]:
    return key >> SEGMENT_SHIFT, key & _OFFSET_MASK


def cover(sizes: dict[int, int], deficit: int) -> list[int] | None:
    """Few of the segments ``sizes`` (index -> size) that add up to ``deficit`` bytes: the
    smallest one that covers it alone, else the largest ones; None when all fall short."""
    alone = [(size, index) for index, size in sizes.items() if size >= deficit]
    if alone:
        return [min(alone)[1]]
    chosen: list[int] = []
    total = 0
    for index, size in sorted(sizes.items(), key=lambda item: item[1], reverse=True):
        chosen.append(index)
        total += size
        if total >= deficit:
            return chosen
    return None


class RunAllocator:
    """Allocates ALIGN-multiple runs from registered segments; knows nothing about memory."""

    def __init__(self) -> None:
        self._free_size: dict[int, int] = {}  # run start key -> size
        self._free_start: dict[int, int] = {}  # run end key -> start key
        self._classes: list[dict[int, int]] = [{} for _ in range(_CLASSES)]
        self._nonempty = 0  # bit c set <=> self._classes[c] is non-empty
        self._used: dict[int, int] = {}  # allocated start key -> size
        self._segment_sizes: dict[int, int] = {}
        self.used_bytes = 0

    def add_segment(self, segment: int, size: int) -> None:
        if size % ALIGN or size <= 0 or size >= 1 << SEGMENT_SHIFT:
            raise ValueError(f"segment size {size} must be a positive multiple of {ALIGN}")
        if segment in self._segment_sizes:
            raise ValueError(f"segment {segment} already registered")
        self._segment_sizes[segment] = size
        self._insert(make_key(segment, 0), size)

    def remove_segment(self, segment: int) -> None:
        """Forget a segment that holds no allocated run; ValueError otherwise."""
        if not self.is_empty(segment):
            raise ValueError(f"segment {segment} is unknown or still holds allocated blocks")
        size = self._segment_sizes.pop(segment)
        self._remove(make_key(segment, 0), size)

    def is_empty(self, segment: int) -> bool:
        """The segment is registered and one free run covers all of it."""
        size = self._segment_sizes.get(segment)
        return size is not None and self._free_size.get(make_key(segment, 0)) == size

    def take(self, size: int) -> int | None:
        """Start key of a fresh run of ``size`` bytes (an ALIGN multiple), or None if none fits."""
        key = self._find(size)
        if key is None:
            return None
        run = self._free_size[key]
        self._remove(key, run)
        if run > size:
            self._insert(key + size, run - size)
        self._used[key] = size
        self.used_bytes += size
        return key

    def allocated_size(self, key: int) -> int | None:
        return self._used.get(key)

    def give(self, key: int) -> bool:
        """Return the run starting at ``key``; True when that left its segment empty.

        KeyError if the run is not allocated.
        """
        size = self._used.pop(key)
        self.used_bytes -= size
        before = self._free_start.get(key)
        if before is not None:
            before_size = self._free_size[before]
            self._remove(before, before_size)
            key, size = before, size + before_size
        after_size = self._free_size.get(key + size)
        if after_size is not None:
            self._remove(key + size, after_size)
            size += after_size
        self._insert(key, size)
        # Only a run that starts a segment can cover all of it: the size lookup is rarely paid.
        return not key & _OFFSET_MASK and size == self._segment_sizes[key >> SEGMENT_SHIFT]

    def largest_free(self) -> int:
        if not self._nonempty:
            return 0
        return max(self._classes[self._nonempty.bit_length() - 1].values())

    def free_runs(self) -> list[tuple[int, int, int]]:
        """(segment, offset, size) of every free run, sorted; for tests and diagnostics."""
        return sorted((*split_key(key), size) for key, size in self._free_size.items())

    def _find(self, size: int) -> int | None:
        near = size.bit_length() - 1
        runs = self._classes[near]
        if runs:
            probes = 0  # (a count, not enumerate(): compiled, no tuple per run looked at)
            for key in reversed(runs):
                if runs[key] >= size:
                    return key
                probes += 1  # noqa: SIM113 (see above)
                if probes >= _NEAR_FIT_PROBES:
                    break
        # Every run in a class >= ceil(log2(size)) fits; take the smallest such class.
        mask = self._nonempty >> (size - 1).bit_length()
        if not mask:
            return None
        cls = (size - 1).bit_length() + (mask & -mask).bit_length() - 1
        return next(reversed(self._classes[cls]))

    def _insert(self, key: int, size: int) -> None:
        cls = size.bit_length() - 1
        self._classes[cls][key] = size
        self._nonempty |= 1 << cls
        self._free_size[key] = size
        self._free_start[key + size] = key

    def _remove(self, key: int, size: int) -> None:
        cls = size.bit_length() - 1
        runs = self._classes[cls]
        del runs[key]
        if not runs:
            self._nonempty &= ~(1 << cls)
        del self._free_size[key]
        del self._free_start[key + size]
