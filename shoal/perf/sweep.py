"""Concurrency sweeps: ``8``, ``1,8,64`` or a doubling range ``1:64``."""

from __future__ import annotations


def parse_concurrency(text: str) -> tuple[int, ...]:
    """The concurrency levels of ``text``, in the order given, without repeats.

    ``A:B`` doubles from ``A`` up to ``B`` (``1:16`` is 1, 2, 4, 8, 16; ``B`` is always included).
    Parts can be mixed: ``1,4:16,64``.
    """
    levels: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty concurrency level in '{text}'")
        for level in _expand(part):
            if level not in levels:
                levels.append(level)
    return tuple(levels)


def _expand(part: str) -> list[int]:
    low_text, colon, high_text = part.partition(":")
    low = _positive(low_text, part)
    if not colon:
        return [low]
    high = _positive(high_text, part)
    if high < low:
        raise ValueError(f"concurrency range '{part}' goes down")
    return _doubling(low, high)


def _doubling(low: int, high: int) -> list[int]:
    levels, level = [], low
    while level < high:
        levels.append(level)
        level *= 2
    return [*levels, high]


def _positive(text: str, part: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"concurrency '{part}' is not a whole number") from None
    if value <= 0:
        raise ValueError(f"concurrency must be positive, got '{part}'")
    return value


def parse_concurrency_range(text: str) -> tuple[int, ...]:
    """perf_analyzer's ``--concurrency-range start[:end[:step]]``: from ``start`` up to ``end``
    (default ``start``) by ``step`` (default 1), as perf_analyzer steps: ``1:8:2`` is 1, 3, 5,
    7; ``end`` is measured only when a step lands on it."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.strip() for p in parts):
        raise ValueError(f"--concurrency-range expects start[:end[:step]], got '{text}'")
    start = _positive(parts[0].strip(), text)
    end = _positive(parts[1].strip(), text) if len(parts) > 1 else start
    step = _positive(parts[2].strip(), text) if len(parts) > 2 else 1
    if end < start:
        raise ValueError(f"concurrency range '{text}' goes down")
    return tuple(range(start, end + 1, step))
