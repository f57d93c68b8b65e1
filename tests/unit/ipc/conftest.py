"""Every IPC test must leave no file descriptor and no /dev/shm segment behind."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest


def _open_fds() -> dict[int, str]:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the fd of the directory listing itself, already closed
    return fds


def _shm_segments() -> set[str]:
    # Only this process's arenas: other test suites may run beside us and use /dev/shm too.
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"shoal-{os.getpid()}-")}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    # Objects an earlier test left for the collector (gRPC channels, event loops) are freed now,
    # not in the middle of this test where their descriptors would change under the count.
    gc.collect()
    fds_before = _open_fds()
    shm_before = _shm_segments()
    yield
    gc.collect()  # mappings still exported to NumPy views are released with them
    leaked_fds = {fd: target for fd, target in _open_fds().items() if fd not in fds_before}
    assert not leaked_fds, f"file descriptors left open: {leaked_fds}"
    leaked_shm = _shm_segments() - shm_before
    assert not leaked_shm, f"/dev/shm segments left behind: {sorted(leaked_shm)}"
