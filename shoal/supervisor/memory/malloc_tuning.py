"""Keep large buffers mapped between requests (glibc's malloc only).

By default glibc serves an allocation over a dynamic threshold (128 KiB to start with) with a
fresh ``mmap`` and gives it back to the kernel when freed, and trims the heap's top when more
than twice that is free. A server that reads a 4 MiB tensor into a new buffer on every request
then pays for a thousand page faults (and the kernel zeroing each page) per buffer: on a VM that
was more than half of the supervisor's CPU per 4 MiB HTTP request (6.0 ms, 2.5 ms once tuned;
BENCHMARKS.md). With these settings buffers up to 32 MiB come from the heap, and up to 128 MiB
of free heap stays mapped for the next request, as jemalloc or tcmalloc would keep it.

Nothing changes when the C library is not glibc, or when the operator set glibc's own
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 128 * 1024 * 1024


def keep_large_buffers_mapped() -> bool:
    """Apply the settings to this process; True if they were applied."""
    if not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False  # the operator's choice stands
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
