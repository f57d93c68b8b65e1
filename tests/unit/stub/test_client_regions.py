"""The stub's access to clients' shared-memory regions: copies in, ``pwrite`` out, and a window
the object no longer holds is :class:`RegionShrunk`, never a fault."""

from __future__ import annotations

import os

import numpy as np
import posix_ipc
import pytest

from shoal.ipc.tensor import RegionLocation
from shoal.stub.memory import ClientRegions, RegionReplaced, RegionShrunk


@pytest.fixture
def region():
    key = f"/shoal_unit_region_{os.getpid()}"
    shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4096)
    os.pwrite(shm.fd, bytes(range(256)) * 16, 0)
    regions = ClientRegions()
    # named as the core names it: this process plays the core, which holds the object open
    yield regions, f"7:{os.getpid()}:{shm.fd}:{os.fstat(shm.fd).st_ino}:{key}", shm.fd
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


def _fds_on(key: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == f"/dev/shm{key}"
        except FileNotFoundError:  # the listing's own fd, closed since
            pass
    return count


def test_a_forgotten_registration_is_closed(region):
    regions, name, _fd = region
    key = name.split(":", 4)[-1]
    regions.view(RegionLocation(name, 0, 8))
    assert _fds_on(key) == 2  # the test's and the stub's
    regions.forget(name)
    assert _fds_on(key) == 1 and len(regions) == 0
    regions.forget(name)  # told twice, or about one never opened here: nothing happens


def test_a_region_forgotten_while_in_use_is_closed_by_its_last_user(region):
    regions, name, _fd = region
    key = name.split(":", 4)[-1]
    entry = regions._checked(RegionLocation(name, 0, 8))  # a BLS thread between check and pread
    regions.forget(name)
    assert os.fstat(entry.fd).st_size == 4096, "still open for the thread using it"
    regions._done(entry)
    assert _fds_on(key) == 1


def test_the_registered_object_is_read_after_its_name_was_unlinked_and_taken(region):
    regions, name, fd = region
    key = name.split(":", 4)[-1]
    posix_ipc.unlink_shared_memory(key)
    other = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4096)  # the name, taken anew
    try:
        os.pwrite(other.fd, b"\xee" * 16, 0)
        assert bytes(regions.view(RegionLocation(name, 0, 4))) == bytes(range(4))
        regions.write(RegionLocation(name, 0, 2), memoryview(b"ok"))
        assert os.pread(fd, 2, 0) == b"ok" and os.pread(other.fd, 2, 0) == b"\xee\xee"
        # Where the core's fd cannot be reached, the key is opened, and its new object refused.
        _gen, _pid, fd_number, inode, _key = name.split(":", 4)
        by_key = f"8:0:{fd_number}:{inode}:{key}"
        with pytest.raises(RegionReplaced, match="no longer the one registered"):
            regions.view(RegionLocation(by_key, 0, 4))
    finally:
        other.close_fd()
        other.unlink()
        posix_ipc.SharedMemory(key, posix_ipc.O_CREAT, size=4096).close_fd()  # for the fixture


def test_a_file_elsewhere_with_the_registered_inode_number_is_refused(region, tmp_path):
    regions, name, _fd = region
    key = name.split(":", 4)[-1]
    other = tmp_path / "not_shared_memory"
    other.write_bytes(b"\0" * 4096)
    with open(other, "r+b") as f:
        # The core's fd number now names a file on another file system whose inode number is
        # given as the registered one: only the device tells them apart.
        forged = f"9:{os.getpid()}:{f.fileno()}:{os.fstat(f.fileno()).st_ino}:{key}"
        with pytest.raises(RegionReplaced, match="no longer the one registered"):
            regions.write(RegionLocation(forged, 0, 2), memoryview(b"ok"))
    assert other.read_bytes()[:2] == b"\0\0"
