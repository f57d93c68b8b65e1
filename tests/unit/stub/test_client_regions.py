"""The stub's access to clients' shared-memory regions: copies in, ``pwrite`` out, and a window
the object no longer holds is :class:`RegionShrunk`, never a fault."""

from __future__ import annotations

import os

import numpy as np
import posix_ipc
import pytest

from shoal.ipc.tensor import RegionLocation
from shoal.stub.memory import ClientRegions, RegionShrunk


@pytest.fixture
def region():
    key = f"/shoal_unit_region_{os.getpid()}"
    shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4096)
    os.pwrite(shm.fd, bytes(range(256)) * 16, 0)
    regions = ClientRegions()
    yield regions, f"7:{key}", shm.fd
    regions.close()
    shm.close_fd()
    shm.unlink()


def test_an_input_is_a_copy_of_the_window(region):
    regions, name, fd = region
    view = regions.view(RegionLocation(name, 16, 32))
    assert bytes(view) == bytes(range(16, 48))
    os.pwrite(fd, b"\xff" * 32, 16)  # the client writes its memory afterwards
    assert bytes(view) == bytes(range(16, 48))
    view[0] = 1  # the model's own: writable, the client sees nothing
    assert os.pread(fd, 1, 16) == b"\xff"


def test_a_shrunk_object_fails_reads_and_writes(region):
    regions, name, fd = region
    regions.view(RegionLocation(name, 0, 4096))  # opened while whole
    os.ftruncate(fd, 100)
    with pytest.raises(RegionShrunk, match="shrunk to 100 bytes: bytes 64 to 164"):
        regions.view(RegionLocation(name, 64, 100))
    with pytest.raises(RegionShrunk):
        regions.write(RegionLocation(name, 64, 100), memoryview(b"x" * 100))
    assert os.fstat(fd).st_size == 100  # nothing written
    assert bytes(regions.view(RegionLocation(name, 0, 100))) == (bytes(range(100)))


def test_an_output_is_written_in_place(region):
    regions, name, fd = region
    regions.write(RegionLocation(name, 8, 16), memoryview(np.arange(4, dtype=np.float32)).cast("B"))
    assert np.frombuffer(os.pread(fd, 16, 8), np.float32).tolist() == [0, 1, 2, 3]
