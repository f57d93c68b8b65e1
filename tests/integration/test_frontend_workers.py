"""``shoal serve --frontend-workers 2``: two worker processes serve HTTP and gRPC around the core
(more where ``SHOAL_TEST_FRONTEND_WORKERS`` asks for more).

The core deals new connections to the workers in turn; a test that needs a given worker opens
probe connections until it is that worker's turn (``through``), then its own. Each scenario
here also runs with one worker elsewhere in the suite.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import queue
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tests.integration.server import (
    BUNDLED,
    FRONTEND_WORKERS,
    TEST_MODELS,
    ShoalServer,
    command_lines,
    holder,
    tcp_sockets,
)

pytestmark = pytest.mark.timeout(120)

MODELS = (
    "identity",
    "add_sub",
    "seq_direct",
    "ens_chain",
    "ens_scale",
    "bls_add_sub",
    "decoupled_repeat",
    "cancel_waiter",
    "slow",
    "slow_echo",
)


#: Two workers, or the suite's count where it asks for more (``SHOAL_TEST_FRONTEND_WORKERS=7``):
#: what these tests check holds for any count above one, and a machine with many cores runs more.
WORKERS = max(2, int(FRONTEND_WORKERS))


def _start(*extra: str, metrics: bool = False) -> ShoalServer:
    args = ["--frontend-workers", str(WORKERS), "--model-control-mode", "explicit", *extra]
    for name in MODELS:
        args += ["--load-model", name]
    return ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args), metrics=metrics)


@pytest.fixture(scope="module")
def server() -> Iterator[ShoalServer]:
    with _start(metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def worker_pids(server: ShoalServer) -> list[int]:
    """The server's frontend worker processes, by index."""
    assert server.proc is not None
    found: dict[int, int] = {}
    parent = str(server.proc.pid).encode()
    for pid, args in command_lines():
        ours = b"--parent" in args and args[args.index(b"--parent") + 1] == parent
        if ours and any(b"worker_main" in a for a in args):
            found[int(args[args.index(b"--index") + 1])] = pid
    return [found[i] for i in sorted(found)]


def _wait_for_workers(
    server: ShoalServer, count: int, exclude: set[int] = frozenset()
) -> list[int]:
    """The ``count`` workers' pids once each serves (the core deals it connections)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = worker_pids(server)
        # A started worker is dealt connections once it serves: until then the probes go to
        # the others.
        if (
            len(pids) == count
            and not exclude & set(pids)
            and {probe_holder(server, pids) for _ in pids} == set(range(count))
        ):
            return pids
        time.sleep(0.05)  # polling the process table
    raise AssertionError(f"workers now: {worker_pids(server)}\n{server.output}")


@contextlib.contextmanager
def through(server: ShoalServer, index: int) -> Iterator[None]:
    """The next connection opened (one, HTTP or gRPC) goes to worker ``index``.

    The core deals connections to the workers in turn (``workers/dealing.py``): a probe
    connection shows whose turn it was, so probes are opened until the next turn is ``index``'s.
    Nothing else may connect meanwhile: the tests of a server run one at a time."""
    pids = worker_pids(server)
    for _ in range(len(pids)):
        if (probe_holder(server, pids) + 1) % len(pids) == index:
            yield
            return
    raise AssertionError(f"the connections were not dealt in turn over {pids}")


def probe_holder(server: ShoalServer, pids: list[int]) -> int:
    """The index of the worker that serves a new connection (answered once, then closed)."""
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as probe:
        probe.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert probe.recv(4096).startswith(b"HTTP/1.1 200 ")  # served: its worker holds it
        holder = _holder_of(probe, pids)
    assert holder is not None, f"no worker of {pids} holds the probe"
    return holder


def _holder_of(conn: socket.socket, pids: list[int]) -> int | None:
    """The index in ``pids`` of the worker holding the server's end of loopback ``conn``."""
    pid = holder(pids, tcp_sockets(remote_port=conn.getsockname()[1]))
    return None if pid is None else pids.index(pid)


def _until_stopped(pid: int) -> None:
    """Wait until every thread of ``pid`` has stopped. ``kill`` returns before that: the thread
    the kernel hands SIGSTOP to stops the others only when it next runs."""
    deadline = time.monotonic() + 10
    while not all(state in "Tt" for state in _thread_states(pid)):
        assert time.monotonic() < deadline, f"worker {pid} did not stop"
        time.sleep(0.001)  # polling the process table


def _thread_states(pid: int) -> list[str]:
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # The state follows the command name, which is in parentheses.
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # a thread that exited meanwhile
    return states


def _add_sub_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_two_workers_serve_both_protocols(server):
    assert len(_wait_for_workers(server, WORKERS)) == WORKERS
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    for index in range(WORKERS):
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            with through(server, index):
                client = module.InferenceServerClient(url)
                assert client.is_server_ready()  # connected through worker ``index``
            try:
                assert client.is_model_ready("add_sub")
                assert client.get_model_metadata("add_sub") is not None
                result = client.infer("add_sub", _add_sub_inputs(module, a, b))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            finally:
                client.close()


def test_connections_are_dealt_to_the_workers_in_turn():
    """A burst of connections (a load generator's start) is spread evenly: each worker gets its
    share, over both protocols, whichever worker woke first."""
    args = ("--frontend-workers", "3", "--model-control-mode", "explicit")
    with ShoalServer(BUNDLED, extra_args=args) as running:
        pids = _wait_for_workers(running, 3)
        ports = [int(url.rsplit(":", 1)[1]) for url in (running.url, running.grpc_url)]
        opened = [socket.create_connection(("127.0.0.1", ports[i % 2])) for i in range(12)]
        try:
            holders: list[int | None] = [None] * len(opened)
            deadline = time.monotonic() + 30
            while None in holders:  # each worker takes its connections in its own loop turn
                assert time.monotonic() < deadline, holders
                holders = [_holder_of(conn, pids) for conn in opened]
                time.sleep(0.01)  # polling the workers' descriptors
            assert [holders.count(index) for index in range(3)] == [4, 4, 4], holders
        finally:
            for conn in opened:
                conn.close()


def test_json_and_string_tensors_round_trip(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        strings = np.array([b"a", b"", "é".encode()], dtype=object)
        floats = np.array([1.5, -2.0], dtype=np.float32)
        inputs = [
            httpclient.InferInput("IN_STRING", [3], "BYTES"),
            httpclient.InferInput("IN_FP32", [2], "FP32"),
        ]
        inputs[0].set_data_from_numpy(strings, binary_data=False)
        inputs[1].set_data_from_numpy(floats, binary_data=False)
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=False)
            for n in ("OUT_STRING", "OUT_FP32")
        ]
        result = client.infer("identity", inputs, outputs=outputs)
        # tritonclient decodes JSON strings to str
        assert result.as_numpy("OUT_STRING").tolist() == [s.decode() for s in strings]
        np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), floats)
        with pytest.raises(InferenceServerException, match="IN_NOPE"):
            bad = httpclient.InferInput("IN_NOPE", [1], "FP32")
            bad.set_data_from_numpy(np.zeros(1, np.float32))
            client.infer("identity", [bad])
    finally:
        client.close()


def test_large_tensors_cross_the_worker_link_intact(server):
    data = np.random.default_rng(7).random(1 << 20, dtype=np.float32)  # 4 MiB
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput("IN_FP32", [data.size], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("identity", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
        finally:
            client.close()


def test_large_grpc_calls_at_once_come_back_byte_exact(server):
    """Eight 6 MiB calls at once on one channel: each reply is written from the response's
    memory, which is given back only once written, so none may carry another's bytes."""
    _large_grpc_calls_at_once(server.grpc_url, 8)


def test_one_worker_serves_large_grpc_calls_byte_exact():
    with _start("--frontend-workers", "1") as one:
        _large_grpc_calls_at_once(one.grpc_url, 4)
        assert "Traceback" not in one.output, one.output


def _large_grpc_calls_at_once(url: str, count: int) -> None:
    rng = np.random.default_rng(11)
    datas = [rng.random(3 << 19, dtype=np.float32) for _ in range(count)]  # 6 MiB each
    client = grpcclient.InferenceServerClient(url)
    try:
        answers: queue.Queue = queue.Queue()
        for index, data in enumerate(datas):
            tensor = grpcclient.InferInput("IN_FP32", [data.size], "FP32")
            tensor.set_data_from_numpy(data)
            client.async_infer(
                "identity",
                [tensor],
                functools.partial(lambda i, result, error: answers.put((i, result, error)), index),
            )
        for _ in datas:
            index, result, error = answers.get(timeout=60)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), datas[index])
    finally:
        client.close()


_ARENA_MAP = re.compile(rb"memfd:shoal-arena-(\d+)-\d+")
#: Frontend workers' input arenas have ids from 2**32; stubs' output arenas from 1.
_WORKER_ARENAS = 1 << 32


def mapped_arenas(pid: int) -> set[int]:
    """The ids of the arenas process ``pid`` maps now."""
    with open(f"/proc/{pid}/maps", "rb") as maps:
        return {int(m[1]) for m in _ARENA_MAP.finditer(maps.read())}


def worker_arenas(pid: int) -> set[int]:
    return {i for i in mapped_arenas(pid) if i >= _WORKER_ARENAS}


def stub_arenas(pid: int) -> set[int]:
    return {i for i in mapped_arenas(pid) if 0 < i < _WORKER_ARENAS}


def _stub_of(server: ShoalServer, model: str) -> int:
    for pid in server.stub_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f"{model}_0".encode() in f.read().split(b"\0"):
                return pid
    raise AssertionError(f"no stub of {model}")


#: ``clock_nanosleep`` on x86-64 and arm64: what ``time.sleep`` waits in (Python 3.11+).
_CLOCK_NANOSLEEP = {"x86_64": 230, "aarch64": 115}


def _until_in_model_sleep(pid: int, timeout: float = 30.0) -> None:
    """Wait until a thread of stub ``pid`` sleeps in ``time.sleep``: slow_echo's execute holds
    its request (an idle stub waits on its doorbell instead, another system call)."""
    number = str(_CLOCK_NANOSLEEP[os.uname().machine])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/syscall") as f:
                if f.read().split(" ", 1)[0] == number:
                    return
        time.sleep(0.01)  # polling the stub's state
    raise AssertionError(f"stub {pid} never started executing the request")


def _slow_echo(module, url: str, data: np.ndarray, seconds: float = 0.0) -> np.ndarray:
    client = module.InferenceServerClient(url)
    try:
        inputs = [
            module.InferInput("IN", [data.size], "FP32"),
            module.InferInput("SECONDS", [1], "FP32"),
        ]
        inputs[0].set_data_from_numpy(data)
        inputs[1].set_data_from_numpy(np.array([seconds], np.float32))
        return client.infer("slow_echo", inputs).as_numpy("OUT")
    finally:
        client.close()


def test_large_tensors_cross_by_descriptor_both_ways(server):
    """A large input reaches the stub in the worker's arena; a large output reaches the worker
    in the stub's arena. A restarted stub's old segments are dropped by the workers."""
    stub = _stub_of(server, "slow_echo")
    data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        np.testing.assert_array_equal(_slow_echo(module, url, data), data)
    assert worker_arenas(stub), "the stub never mapped a worker's arena"
    workers = _wait_for_workers(server, WORKERS)
    old = stub_arenas(stub)  # the stub maps its own output arena
    assert any(old & stub_arenas(pid) for pid in workers), "no worker mapped the stub's outputs"
    os.kill(stub, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(old & stub_arenas(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling: the workers hear of the exit and unmap its segments
    assert not any(old & stub_arenas(pid) for pid in workers), "a worker kept a dead stub's arena"
    while time.monotonic() < deadline:  # the stub restarts and serves again
        try:
            np.testing.assert_array_equal(_slow_echo(httpclient, server.url, data), data)
            break
        except InferenceServerException:
            time.sleep(0.1)  # polling the restart
    np.testing.assert_array_equal(_slow_echo(grpcclient, server.grpc_url, data), data)


def test_a_worker_killed_with_large_requests_in_flight_leaves_nothing_mapped(server):
    pids = _wait_for_workers(server, WORKERS)
    stub = _stub_of(server, "slow_echo")
    core = server.proc.pid
    shm_before = set(os.listdir("/dev/shm"))
    results: queue.Queue = queue.Queue()
    data = np.ones(1 << 20, dtype=np.float32)  # 4 MiB
    with through(server, 0):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inputs = [
            grpcclient.InferInput("IN", [data.size], "FP32"),
            grpcclient.InferInput("SECONDS", [1], "FP32"),
        ]
        inputs[0].set_data_from_numpy(data)
        inputs[1].set_data_from_numpy(np.array([1.0], np.float32))
        client.async_infer(
            "slow_echo", inputs, callback=lambda result, error: results.put((result, error))
        )
        _until_in_model_sleep(stub)  # the call has reached the stub and holds its input
    held = worker_arenas(stub)
    assert held, "the request never reached the stub"
    os.kill(pids[0], signal.SIGKILL)
    _, error = results.get(timeout=30)
    assert error is not None  # its connection died with the worker
    client.close()
    dead = held - set().union(*(worker_arenas(pid) for pid in pids[1:]))
    assert dead, "no arena of the killed worker was mapped"
    deadline = time.monotonic() + 15
    while (dead & (worker_arenas(stub) | worker_arenas(core))) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling: the stub finishes the request, then both drop the arena
    assert not dead & worker_arenas(stub), "the stub still maps the dead worker's arena"
    assert not dead & worker_arenas(core), "the core still maps the dead worker's arena"
    assert set(os.listdir("/dev/shm")) - shm_before == set()
    _wait_for_workers(server, WORKERS, exclude={pids[0]})
    test_two_workers_serve_both_protocols(server)


def test_large_bytes_tensors_go_by_block_and_are_still_checked(server):
    """A large BYTES tensor crosses by descriptor both ways; a malformed one is still refused
    with Triton's message."""
    strings = np.array([os.urandom(n % 700) for n in range(400)], dtype=object)  # ~140 KiB
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput("IN_STRING", [strings.size], "BYTES")
            tensor.set_data_from_numpy(strings)
            result = client.infer("identity", [tensor])
            assert result.as_numpy("OUT_STRING").tolist() == strings.tolist()
        finally:
            client.close()
    body = b"\xff\xff\x00\x00" + bytes(64 << 10)  # an element longer than the tensor
    header = (
        b'{"inputs":[{"name":"IN_STRING","shape":[1],"datatype":"BYTES",'
        b'"parameters":{"binary_data_size":%d}}]}' % len(body)
    )
    request = urllib.request.Request(
        f"http://{server.url}/v2/models/identity/infer",
        data=header + body,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert b"element byte size indicator exceeds the end of the buffer" in refused.value.read()


def _seq_step(url: str, corr: int, value: int, start: bool, end: bool) -> int:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(
            "seq_direct", [tensor], sequence_id=corr, sequence_start=start, sequence_end=end
        )
        return int(result.as_numpy("OUT")[0][0])
    finally:
        client.close()


def test_a_sequence_continues_across_workers(server):
    values = list(range(1, max(4, WORKERS) + 1))  # every worker takes a step
    sums = []
    for step, value in enumerate(values):
        last = step == len(values) - 1
        with through(server, step % WORKERS):
            sums.append(_seq_step(server.url, 77, value, start=step == 0, end=last))
    assert sums == [sum(values[: step + 1]) for step in range(len(values))]


def test_ensemble_and_bls(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("X", [3], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        chained = client.infer("ens_chain", [x]).as_numpy("Y")
        assert chained.shape == (3,)
        a, b = np.arange(4, dtype=np.float32), np.full(4, 2, np.float32)
        inputs = [grpcclient.InferInput("A", [4], "FP32"), grpcclient.InferInput("B", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("bls_add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    finally:
        client.close()


def test_decoupled_stream(server):
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("decoupled_repeat", [count])
        got = []
        for _ in range(3):
            result, error = responses.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("INDEX")[0]))
        assert sorted(got) == [0, 1, 2]
    finally:
        client.stop_stream()
        client.close()


def test_a_stream_after_a_failed_one_gets_only_its_own_answers(server):
    """Every stream gets one answer per request, also after a stream whose request failed (the
    compiled link once ended every later stream with the earlier failure as a second answer)."""
    good = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="FP32", shape=[4])
        good.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    unknown = service_pb2.ModelInferRequest(model_name="nope")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        for request, failed in ((good, False), (unknown, True), (good, False), (good, False)):
            replies = list(stream(iter([request]), timeout=30))
            assert [bool(reply.error_message) for reply in replies] == [failed], replies


def test_a_stream_after_a_cancelled_one_still_ends(server):
    """A stream the client cancels mid-way leaves later streams on that worker whole (the
    compiled link once swallowed the end of every later stream: they hung)."""
    count = service_pb2.ModelInferRequest(model_name="decoupled_repeat")
    count.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    count.raw_input_contents.append(np.array([20_000], np.int32).tobytes())
    good = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="FP32", shape=[4])
        good.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:  # one connection: one worker
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        requests: queue.Queue[service_pb2.ModelInferRequest | None] = queue.Queue()
        requests.put(count)
        long_one = stream(iter(requests.get, None), timeout=60)
        assert not next(long_one).error_message
        long_one.cancel()
        for _ in range(2):
            replies = list(stream(iter([good]), timeout=30))
            assert [reply.error_message for reply in replies] == [""], replies


def test_shared_memory_registered_through_one_worker_used_through_another(server):
    key = f"/shoal_workers_{os.getpid()}"
    handle = shm.create_shared_memory_region("wk_in", key, 32)
    try:
        a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
        shm.set_shared_memory_region(handle, [a, b])
        with through(server, 0):
            registrar = httpclient.InferenceServerClient(server.url)
            registrar.register_system_shared_memory("wk_in", key, 32)
            registrar.close()
        with through(server, 1):
            client = grpcclient.InferenceServerClient(server.grpc_url)
            try:
                status = client.get_system_shared_memory_status()
                assert [r.name for r in status.regions.values()] == ["wk_in"]
                inputs = [
                    grpcclient.InferInput("INPUT0", [4], "FP32"),
                    grpcclient.InferInput("INPUT1", [4], "FP32"),
                ]
                inputs[0].set_shared_memory("wk_in", 16, offset=0)
                inputs[1].set_shared_memory("wk_in", 16, offset=16)
                result = client.infer("add_sub", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                client.unregister_system_shared_memory("wk_in")
            finally:
                client.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_client_that_goes_away_cancels_its_request(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        mark = len(server.output)
        call = client.async_infer("cancel_waiter", [tensor], callback=lambda *_: None)
        deadline = time.monotonic() + 30
        while "cancel_waiter: started" not in server.output[mark:]:
            assert time.monotonic() < deadline, server.output[mark:]
            time.sleep(0.02)  # polling the server log
        call.cancel()
        while "cancel_waiter: cancelled=True" not in server.output[mark:]:
            assert time.monotonic() < deadline, server.output[mark:]
            time.sleep(0.02)
    finally:
        client.close()


def _metric(server: ShoalServer, name: str, model: str) -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_statistics_and_metrics_count_every_worker(server):
    def count() -> int:
        client = httpclient.InferenceServerClient(server.url)
        try:
            stats = client.get_inference_statistics("add_sub")["model_stats"][0]
            return int(stats["inference_count"])
        finally:
            client.close()

    before, metric_before = count(), _metric(server, "nv_inference_request_success", "add_sub")
    a = np.zeros(4, dtype=np.float32)
    for index in range(WORKERS):
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            with through(server, index):
                client = module.InferenceServerClient(url)
                client.infer("add_sub", _add_sub_inputs(module, a, a))
            for _ in range(2):
                client.infer("add_sub", _add_sub_inputs(module, a, a))
            client.close()
    sent = 6 * WORKERS
    assert count() - before == sent
    assert _metric(server, "nv_inference_request_success", "add_sub") - metric_before == sent


def _slow_call(url: str, seconds: float, results: queue.Queue) -> grpcclient.InferenceServerClient:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    client.async_infer(
        "slow", [tensor], callback=lambda result, error: results.put((result, error))
    )
    return client


def test_a_killed_worker_fails_only_its_requests_and_is_restarted(server):
    pids = _wait_for_workers(server, WORKERS)
    results: queue.Queue = queue.Queue()
    with through(server, 0):
        doomed = _slow_call(server.grpc_url, 2.0, results)
        time.sleep(0.3)  # the call reaches the worker (it cannot be observed from outside)
    os.kill(pids[0], signal.SIGKILL)
    _, error = results.get(timeout=30)
    assert error is not None  # the connection died with the worker
    doomed.close()
    client = httpclient.InferenceServerClient(server.url)  # the other worker serves meanwhile
    try:
        assert client.is_server_live()
    finally:
        client.close()
    restarted = _wait_for_workers(server, WORKERS, exclude={pids[0]})
    assert restarted[1:] == pids[1:]
    assert "frontend worker 0" in server.output and "restarting it" in server.output
    test_two_workers_serve_both_protocols(server)


def test_drain_on_sigterm_finishes_requests_then_stops_the_workers():
    with _start() as running:
        workers = _wait_for_workers(running, WORKERS)
        results: queue.Queue = queue.Queue()
        client = _slow_call(running.grpc_url, 1.0, results)
        time.sleep(0.3)  # the call is in flight
        assert running.stop(signal.SIGTERM) == 0
        result, error = results.get(timeout=30)
        assert error is None, error
        assert float(result.as_numpy("SECONDS_OUT")[0]) == 1.0
        client.close()
        assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]


def _answered(port: int) -> bool | None:
    """None: the connection was refused; else whether an HTTP request on it got an answer."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    except ConnectionRefusedError:
        return None
    with sock:
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            return bool(sock.recv(64))
        except OSError:  # reset, or no answer within the timeout
            return False


def test_a_killed_core_takes_the_workers_with_it():
    """No connection is answered once the core is dead, and the ports refuse new ones at once:
    only the core holds the listening sockets (it deals the connections), so none outlives it
    in a dying worker, accepting connections nobody answers."""
    with _start() as running:
        workers = _wait_for_workers(running, WORKERS)
        stubs = running.stub_pids()
        assert stubs
        ports = [int(url.rsplit(":", 1)[1]) for url in (running.url, running.grpc_url)]
        listening = set().union(*(tcp_sockets(local_port=p, listening=True) for p in ports))
        assert len(listening) == 2
        assert holder(workers, listening) is None
        running.stop(signal.SIGKILL)  # returns once the core is reaped
        reaped = time.monotonic()
        answers = []
        while (answered := _answered(ports[0])) is not None:
            answers.append(answered)
            assert time.monotonic() - reaped < 5, f"still accepting: {answers}"
        assert not any(answers), "a worker answered after the core died"
        deadline = time.monotonic() + 10
        left = set(workers) | stubs
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if _alive(pid)}
            time.sleep(0.05)  # polling the process table
        assert not left, f"outlived the core: {left}"


def test_a_request_in_flight_when_the_core_dies_is_answered_503():
    """The worker answers what it holds once its core is gone (503, unavailable) before it exits:
    a load balancer retries that on another replica, and a dropped connection it would not. The
    answer closes the connection: reused, it would only get 503 again, where a new connection
    is refused and takes the replica out of the balancer."""
    with _start() as running:
        _wait_for_workers(running, WORKERS)
        port = int(running.url.rsplit(":", 1)[1])
        body = json.dumps(
            {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
        ).encode()
        mark = len(running.output)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /v2/models/cancel_waiter/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            deadline = time.monotonic() + 30
            while "cancel_waiter: started" not in running.output[mark:]:
                assert time.monotonic() < deadline, running.output[mark:]
                time.sleep(0.02)  # polling the server log
            running.stop(signal.SIGKILL)
            answer = b""
            while chunk := sock.recv(4096):  # until the worker closes the connection
                answer += chunk
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 503 "), answer
        assert b"\r\nconnection: close" in head, answer


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_grpcio_workers_share_the_port():
    """grpcio binds its own sockets: each worker listens with SO_REUSEPORT on the same port (the
    kernel spreads connections by hash, so a stopped worker cannot steer them here)."""
    with _start("--grpc-server", "grpcio") as running:
        assert len(_wait_for_workers(running, WORKERS)) == WORKERS
        for _ in range(4):
            client = grpcclient.InferenceServerClient(running.grpc_url)
            try:
                a = np.arange(4, dtype=np.float32)
                result = client.infer("add_sub", _add_sub_inputs(grpcclient, a, a))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            finally:
                client.close()


def _bad_preface(server: ShoalServer) -> None:
    """A connection that is not HTTP/2: the worker that accepts it logs it at verbose level."""
    host, port = server.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 64)
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass  # until the worker closes the connection


def _verbose_lines(server: ShoalServer, pid: int) -> int:
    return sum(
        1
        for line in server.output.splitlines()
        if f" {pid} " in line and "HTTP/2 connection error" in line
    )


def _logs_verbose(server: ShoalServer, index: int, pid: int) -> None:
    """Worker ``index`` (``pid``) logs at verbose level: one bad preface through it is logged."""
    before = _verbose_lines(server, pid)
    with through(server, index):
        _bad_preface(server)
    deadline = time.monotonic() + 10
    while _verbose_lines(server, pid) == before:
        assert time.monotonic() < deadline, f"worker {pid} did not log\n{server.output}"
        time.sleep(0.02)  # polling the server log (read by a thread)


def _connection_to(server: ShoalServer, index: int) -> http.client.HTTPConnection:
    """A keep-alive connection that worker ``index`` accepted (and answered once)."""
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    with through(server, index):
        connection.request("GET", "/v2/health/ready")
        connection.getresponse().read()
    return connection


def _update_logging(connection: http.client.HTTPConnection, settings: dict) -> dict:
    connection.request("POST", "/v2/logging", body=json.dumps(settings))
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200, body
    return json.loads(body)


def _update_logging_through(server: ShoalServer, index: int, settings: dict) -> dict:
    connection = _connection_to(server, index)
    try:
        return _update_logging(connection, settings)
    finally:
        connection.close()


def test_log_settings_reach_every_worker_and_restarted_ones(server):
    pids = _wait_for_workers(server, WORKERS)
    assert _update_logging_through(server, 0, {"log_verbose_level": 1})["log_verbose_level"] == 1
    for index, pid in enumerate(pids):  # the worker that took them and the other one, at once
        _logs_verbose(server, index, pid)
    os.kill(pids[1], signal.SIGKILL)
    restarted = _wait_for_workers(server, WORKERS, exclude={pids[1]})
    _logs_verbose(server, 1, restarted[1])  # started with the settings of now
    assert _update_logging_through(server, 1, {"log_verbose_level": 0})["log_verbose_level"] == 0
    quiet = _verbose_lines(server, restarted[0])
    for _ in range(3):  # answered, so applied by worker 0 too: it logs nothing more
        with through(server, 0):
            _bad_preface(server)
    time.sleep(0.3)  # what a verbose worker would have logged by now
    assert _verbose_lines(server, restarted[0]) == quiet


def test_a_log_settings_update_waits_until_every_worker_applied_it(server):
    """Triton answers an update once it logs with the new settings: with workers, once the
    other workers too have applied them (a stopped one holds the answer back)."""
    pids = _wait_for_workers(server, WORKERS)
    connection = _connection_to(server, 0)
    answered: queue.Queue[dict] = queue.Queue()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        _until_stopped(pids[1])
        threading.Thread(
            target=lambda: answered.put(_update_logging(connection, {"log_verbose_level": 1})),
            daemon=True,
        ).start()
        with pytest.raises(queue.Empty):
            answered.get(timeout=0.5)  # worker 1, stopped, has not applied them
    finally:
        os.kill(pids[1], signal.SIGCONT)
    try:
        assert answered.get(timeout=30)["log_verbose_level"] == 1
        _logs_verbose(server, 1, pids[1])
        assert _update_logging(connection, {"log_verbose_level": 0})["log_verbose_level"] == 0
    finally:
        connection.close()


def _post(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{url}{path}", data=json.dumps(body).encode(), headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_generate_and_generate_stream_through_each_worker(server):
    for index in range(WORKERS):
        with through(server, index):
            status, body = _post(
                server.url,
                "/v2/models/add_sub/generate",
                {"INPUT0": [1, 2, 3, 4], "INPUT1": [1] * 4},
            )
            assert status == 200, body
            assert json.loads(body)["OUTPUT0"] == [2.0, 3.0, 4.0, 5.0]
            status, body = _post(
                server.url, "/v2/models/decoupled_repeat/generate_stream", {"COUNT": 3}
            )
            assert status == 200, body
            events = [json.loads(chunk[6:]) for chunk in body.split(b"\n\n") if chunk]
            assert [event["INDEX"] for event in events] == [0, 1, 2]
            status, body = _post(server.url, "/v2/models/decoupled_repeat/generate", {"COUNT": 3})
            assert status == 400 and b"exactly 1 response" in body, body


def test_restricted_apis_are_restricted_by_every_worker():
    admin = "model-repository:admin-key=admin-value"
    flags = (f"--http-restricted-api={admin}", f"--grpc-restricted-protocol={admin}")
    with _start(*flags) as running:
        _wait_for_workers(running, WORKERS)
        for index in range(WORKERS):
            with through(running, index):
                status, body = _post(running.url, "/v2/repository/index", {})
                assert status == 403 and b"expecting header 'admin-key'" in body, body
                allowed = {"admin-key": "admin-value"}
                status, body = _post(running.url, "/v2/repository/index", {}, allowed)
                assert status == 200 and b"add_sub" in body, body
                client = grpcclient.InferenceServerClient(running.grpc_url)
                try:
                    with pytest.raises(InferenceServerException, match="restricted"):
                        client.get_model_repository_index()
                    metadata = {"triton-grpc-protocol-admin-key": "admin-value"}
                    index_ = client.get_model_repository_index(headers=metadata, as_json=True)
                    assert "add_sub" in json.dumps(index_)
                    assert client.is_model_ready("add_sub")  # health is not restricted
                finally:
                    client.close()
