"""Clients' system shared memory read and written without a mapping: a shrunk object is a
client error (INVALID_ARGUMENT), never a SIGBUS."""

from __future__ import annotations

import os

import numpy as np
import posix_ipc
import pytest

from shoal.core.errors import InvalidArgument
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def key():
    name = f"/shoal_unit_registry_{os.getpid()}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=64)
    os.pwrite(shm.fd, bytes(range(64)), 0)
    shm.close_fd()
    yield name
    posix_ipc.unlink_shared_memory(name)


def test_read_and_write_go_through_the_window(key):
    registry = SharedMemoryRegistry()
    registry.register("r", key, 16, 32)
    assert bytes(registry.read("r", 4, 8, what="input 'x'")) == bytes(range(20, 28))
    registry.write("r", 0, memoryview(np.arange(2, dtype=np.int64)), what="output 'y'")
    assert bytes(registry.read("r", 0, 16, what="input 'x'")) == np.arange(2).tobytes()
    location = registry.location("r", 8, 8, what="input 'x'")
    assert (location.offset, location.nbytes) == (24, 8)
    registry.close()


def test_a_shrunk_object_is_a_client_error(key):
    registry = SharedMemoryRegistry()
    registry.register("r", key, 16, 32)
    os.truncate(f"/dev/shm{key}", 20)
    for call in (
        lambda: registry.read("r", 0, 8, what="input 'x'"),
        lambda: registry.write("r", 0, memoryview(b"12345678"), what="output 'y'"),
        lambda: registry.location("r", 0, 8, what="input 'x'"),
    ):
        with pytest.raises(InvalidArgument, match="shrunk to 20 bytes"):
            call()
    assert bytes(registry.read("r", 0, 4, what="input 'x'")) == bytes(range(16, 20))
    assert os.stat(f"/dev/shm{key}").st_size == 20  # nothing was written
    registry.close()


def test_empty_window_is_refused(key):
    registry = SharedMemoryRegistry()
    with pytest.raises(InvalidArgument, match="byte_size must be positive"):
        registry.register("r", key, 0, 0)
    assert registry.status() == []


@pytest.mark.parametrize("slashes", ["", "/", "///"])
def test_the_python_backend_s_prefix_is_reserved_as_in_triton(slashes):
    key = f"{slashes}triton_python_backend_shm_region__mine"
    with pytest.raises(InvalidArgument) as info:
        SharedMemoryRegistry().register("r", key, 0, 8)
    assert str(info.value) == (
        f"cannot register shared memory region 'r' with key '{key}' as the key contains the "
        "reserved prefix 'triton_python_backend_shm_region_'"
    )


@pytest.mark.parametrize("key", ["/", "///", ""])
def test_a_key_of_slashes_only_is_refused_in_triton_s_words(key):
    with pytest.raises(InvalidArgument) as info:
        SharedMemoryRegistry().register("r", key, 0, 8)
    assert str(info.value) == f"cannot register shared memory region 'r' - invalid shm key '{key}'"


def test_leading_slashes_name_the_same_object_as_shm_open(key):
    registry = SharedMemoryRegistry()
    registry.register("r", "//" + key.lstrip("/"), 0, 8)  # glibc's shm_open skips them all
    assert bytes(registry.read("r", 0, 8, what="input 'x'")) == bytes(range(8))
    assert registry.location("r", 0, 8, what="input 'x'").region.endswith(":" + key)
    registry.close()


@pytest.mark.parametrize(("offset", "byte_size"), [(8, 64), (0, 65), (64, 1), (65, 0)])
def test_a_region_past_the_object_is_triton_s_invalid_args(key, offset, byte_size):
    with pytest.raises(InvalidArgument) as info:
        SharedMemoryRegistry().register("r", key, offset, byte_size)
    assert str(info.value).startswith("failed to register shared memory region 'r': invalid args")


@pytest.mark.parametrize(
    ("offset", "byte_size", "words"),
    [
        (32, 1, "Invalid offset for shared memory region: 'r'"),
        (1, 32, "Invalid offset + byte size for shared memory region: 'r'"),
        (
            16,
            2**64 - 16,
            f"Integer overflow detected: byte_size ({2**64 - 16}) + offset (16) exceeds maximum "
            f"value ({2**64 - 1}) for region 'r'",
        ),
    ],
)
def test_a_window_past_the_region_begins_with_triton_s_words(key, offset, byte_size, words):
    registry = SharedMemoryRegistry()
    registry.register("r", key, 16, 32)
    with pytest.raises(InvalidArgument) as info:
        registry.read("r", offset, byte_size, what="input 'x'")
    assert str(info.value).startswith(words + ": input 'x': ")
    registry.close()
