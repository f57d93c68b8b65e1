"""Triton's words for a window (offset, byte size) that a registered region does not hold.

Clients match on them (Triton's QA does), so both kinds of region (system and CUDA) begin their
error with the same words, in the order Triton checks: the offset, an overflow of the sum, the end.
"""

from __future__ import annotations

#: Triton's limit on ``offset + byte_size`` (``SIZE_MAX`` on its 64-bit builds).
SIZE_MAX = 2**64 - 1


def window_fault(name: str, offset: int, byte_size: int, size: int) -> str:
    """Triton's words for a window of region ``name`` (``size`` bytes) that does not fit."""
    if offset >= size:
        return f"Invalid offset for shared memory region: '{name}'"
    if byte_size > SIZE_MAX - offset:
        return (
            f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds "
            f"maximum value ({SIZE_MAX}) for region '{name}'"
        )
    return f"Invalid offset + byte size for shared memory region: '{name}'"
