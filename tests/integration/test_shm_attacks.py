"""Clients that abuse system shared memory: the server answers errors and keeps serving.

A client may unlink its object's name after registering it, or make another object under that
name: requests still use the object it registered (Triton maps it at registration), never the
new one. Every registration keeps an fd open in the core, so their number is bounded by the
open-file limit: a client registering without end gets 503 while everyone else is still served
(it used to take the last fd: a 500, then no new connection was accepted)."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

import numpy as np
import posix_ipc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(180)

KEY = f"/shoal_test_abused_{os.getpid()}"
VALUES = np.arange(16, dtype=np.float32)


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    with ShoalServer(BUNDLED) as srv:
        yield srv


@pytest.fixture
def client(server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_registered_object_is_used_after_its_name_is_unlinked_and_taken(server, client, protocol):
    first = posix_ipc.SharedMemory(KEY, posix_ipc.O_CREX, size=128)
    taker = None
    try:
        os.pwrite(first.fd, VALUES.tobytes(), 0)
        client.register_system_shared_memory("r", KEY, 128)
        first.unlink()  # the client removes its name (the object lives on)
        taker = posix_ipc.SharedMemory(KEY, posix_ipc.O_CREX, size=128)  # and another takes it
        os.pwrite(taker.fd, np.full(32, 7, dtype=np.float32).tobytes(), 0)
        module = httpclient if protocol == "http" else grpcclient
        other = client if protocol == "http" else grpcclient.InferenceServerClient(server.grpc_url)
        tensor = module.InferInput("IN_FP32", [16], "FP32")
        tensor.set_shared_memory("r", 64)
        out = module.InferRequestedOutput("OUT_FP32")
        out.set_shared_memory("r", 64, offset=64)
        other.infer("identity", [tensor], outputs=[out])
        assert np.frombuffer(os.pread(first.fd, 64, 64), np.float32).tolist() == VALUES.tolist()
        assert os.pread(taker.fd, 128, 0) == np.full(32, 7, np.float32).tobytes(), "untouched"
    finally:
        first.close_fd()
        if taker is None:  # failed before another took the name: it may still be the first's
            with contextlib.suppress(posix_ipc.ExistentialError):
                first.unlink()
        else:
            taker.close_fd()
            taker.unlink()


def test_registrations_are_bounded_by_the_open_file_limit(server, client):
    handle = shm.create_shared_memory_region("many", KEY, 64)
    assert server.proc is not None
    before = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (400, before[1]))
    try:
        count = 0
        with pytest.raises(InferenceServerException) as refused:
            while count < 1000:  # the same object under many names
                client.register_system_shared_memory(f"r{count}", KEY, 64)
                count += 1
        assert count == 200, "half the open-file limit"
        assert refused.value.status() == "503", refused.value
        assert "200 regions are registered" in refused.value.message()
        fresh = httpclient.InferenceServerClient(server.url)  # a new connection: an fd
        assert fresh.is_server_live()
        tensor = httpclient.InferInput("IN_FP32", [16], "FP32")
        tensor.set_shared_memory("r0", 64)
        shm.set_shared_memory_region(handle, [VALUES])
        answer = fresh.infer("identity", [tensor])
        np.testing.assert_array_equal(answer.as_numpy("OUT_FP32"), VALUES)
        fresh.close()
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("again", KEY, 64)
    finally:
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, before)
        shm.destroy_shared_memory_region(handle)
