"""A client shared-memory region that a request in flight uses outlives its unregistration, as
in Triton: it stays listed, usable (by that request and new ones) and its name taken until the
last request using it ends, however it ends (answered, timed out, its stub crashed); then no
server process keeps it open (``/proc/<pid>/fd``) or mapped (``/proc/<pid>/maps``)."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer, _children

pytestmark = pytest.mark.timeout(180)

KEY = f"/shoal_test_unregister_{os.getpid()}"
VALUES = np.arange(16, dtype=np.int32)


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    args = ("--model-control-mode", "explicit", "--load-model", "shm_gate")
    with ShoalServer(TEST_MODELS, extra_args=args) as srv:
        yield srv


@pytest.fixture
def region() -> Iterator[shm.SharedMemoryRegion]:
    """128 bytes: the input (16 INT32) in the first half, the output in the second."""
    handle = shm.create_shared_memory_region("gate", KEY, 128)
    shm.set_shared_memory_region(handle, [VALUES])
    yield handle
    shm.destroy_shared_memory_region(handle)


@pytest.fixture
def status(server: ShoalServer) -> Iterator[Callable[[], list[str]]]:
    """The names the server lists (over HTTP, whatever the protocol under test)."""
    client = httpclient.InferenceServerClient(server.url)
    yield lambda: sorted(r["name"] for r in client.get_system_shared_memory_status())
    client.unregister_system_shared_memory()
    client.close()


def _client(server: ShoalServer, protocol: str, timeout: float | None = None):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=timeout or 60.0)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _register(client) -> None:
    client.register_system_shared_memory("in", KEY, 64)
    client.register_system_shared_memory("out", KEY, 64, offset=64)


def _infer(server: ShoalServer, protocol: str, timeout: float | None = None, **params: object):
    """One request of ``shm_gate`` with its input and output in the regions, on a client of
    its own (run in a thread)."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(server, protocol, timeout)
    try:
        tensor = module.InferInput("IN", [16], "INT32")
        tensor.set_shared_memory("in", 64)
        out = module.InferRequestedOutput("OUT")
        out.set_shared_memory("out", 64)
        extra = {"client_timeout": timeout} if timeout is not None and module is grpcclient else {}
        return client.infer("shm_gate", [tensor], outputs=[out], parameters=params, **extra)
    finally:
        client.close()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"the model never reached {path.name}"
        time.sleep(0.01)  # polling the file the model makes


def _holders(server: ShoalServer) -> dict[int, list[str]]:
    """Every server process (core, workers, stubs) that has the object open or mapped."""
    assert server.proc is not None
    found: dict[int, list[str]] = {}
    for pid in {server.proc.pid, *_children(server.proc.pid)}:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            maps = Path(f"/proc/{pid}/maps").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # (an fd closed, or a process gone, while being read)
        uses = [link for link in links if link.startswith(f"/dev/shm{KEY}")]
        uses += [line for line in maps.splitlines() if KEY in line]
        if uses:
            found[pid] = uses
    return found


def _until_released(server: ShoalServer, status: Callable[[], list[str]]) -> None:
    """The regions leave the list and every process lets the object go (stubs close theirs
    between executions, when told)."""
    deadline = time.monotonic() + 30
    while status() or _holders(server):
        assert time.monotonic() < deadline, (status(), _holders(server))
        time.sleep(0.02)  # polling the server's state


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unregistered_while_requests_use_it(server, region, status, tmp_path, protocol):
    client = _client(server, protocol)
    _register(client)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            _infer, server, protocol, started=str(tmp_path / "s1"), gate=str(tmp_path / "g1")
        )
        _wait_for(tmp_path / "s1")
        client.unregister_system_shared_memory()  # every region: both are in use
        assert status() == ["in", "out"], "kept while a request uses them"
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("in", KEY, 64)
        second = pool.submit(  # a new request may still use them, as in Triton
            _infer, server, protocol, started=str(tmp_path / "s2"), gate=str(tmp_path / "g2")
        )
        _wait_for(tmp_path / "s2")  # (on the model's other instance)
        (tmp_path / "g1").touch()
        first.result(timeout=60)
        assert status() == ["in", "out"], "the second request still uses them"
        (tmp_path / "g2").touch()
        second.result(timeout=60)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region, np.int32, [16], 64), VALUES + 1)
    _until_released(server, status)
    _register(client)  # the names are free again
    client.unregister_system_shared_memory()
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_held_after_a_timeout_until_the_model_is_done(server, region, status, tmp_path, protocol):
    """The client gives up (its timeout) while the model runs: the region stays, as in Triton,
    until the model is done with the request (it may still write the output there). A gRPC
    deadline cancels the request; the model sees it (``is_cancelled``) and still runs."""
    client = _client(server, protocol)
    _register(client)
    params = {
        "started": str(tmp_path / "s"),
        "gate": str(tmp_path / "g"),
        "cancelled": str(tmp_path / "c"),
    }
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_infer, server, protocol, 2.0, **params)
        _wait_for(tmp_path / "s")
        client.unregister_system_shared_memory("in")
        client.unregister_system_shared_memory("out")
        assert status() == ["in", "out"]
        with pytest.raises(Exception, match=r"(?i)deadline|timed? ?out"):
            pending.result(timeout=60)
    if protocol == "grpc":  # (an HTTP client that leaves cancels nothing, as in Triton)
        _wait_for(tmp_path / "c")  # the core cancelled the request and told the model
    assert status() == ["in", "out"], "let go while the model may still write into it"
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("out", KEY, 64, offset=64)
    (tmp_path / "g").touch()  # the model, still executing, ends
    _until_released(server, status)
    client.close()


def test_released_when_the_stub_crashes(server, region, status, tmp_path):
    client = _client(server, "http")
    _register(client)
    crashed = server.stub_pids()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            _infer,
            server,
            "http",
            started=str(tmp_path / "s"),
            gate=str(tmp_path / "g"),
            crash=True,
        )
        _wait_for(tmp_path / "s")
        client.unregister_system_shared_memory()
        assert status() == ["in", "out"]
        (tmp_path / "g").touch()
        with pytest.raises(InferenceServerException):
            pending.result(timeout=60)
    _until_released(server, status)
    deadline = time.monotonic() + 60
    while not server.stub_pids() - crashed or not client.is_model_ready("shm_gate"):
        assert time.monotonic() < deadline, server.output
        time.sleep(0.05)  # polling for the restarted instance
    client.close()
