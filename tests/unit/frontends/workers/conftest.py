"""The worker arena tests must leave no file descriptor behind (sockets, memfds, mappings)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.unit.ipc.conftest import _open_fds


@pytest.fixture(autouse=True)
def no_fd_leaks() -> Iterator[None]:
    before = _open_fds()
    yield
    gc.collect()  # mappings still exported to views are released with them
    leaked = {fd: target for fd, target in _open_fds().items() if before.get(fd) != target}
    assert not leaked, f"file descriptors left open: {leaked}"
