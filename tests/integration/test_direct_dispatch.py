"""Direct dispatch: with frontend workers, plain requests go from a worker straight to a stub.

The core grants each worker a route to a plain model version (a channel to each of its stubs)
and takes it back before the version drains; the worker counts the statistics. These tests run
``--frontend-workers 2`` (more where ``SHOAL_TEST_FRONTEND_WORKERS`` asks for more), and check
what a client sees: the same answers and errors as through the core, exact statistics, an
unload that waits for the requests in flight, a stub or a worker that dies.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer
from tests.integration.test_frontend_workers import WORKERS, through, worker_pids

pytestmark = pytest.mark.timeout(180)

ROUTED = "straight to its"

_EXPAND = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            out = pb_utils.Tensor("OUT", np.arange(count, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

_EXPAND_CONFIG = """
name: "expand"
backend: "python"
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


_SUM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            total = pb_utils.Tensor("SUM", np.array([x.sum(dtype=np.float64)]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[total]))
        return responses
"""

_SUM_CONFIG = """
name: "sum"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

#: Calls itself by BLS until DEPTH is 0 (as Triton's QA ``bls_parameters`` does), each level
#: on another of its four instances: the request a worker sent straight to one of them must
#: not have that instance handed its own call.
_RECURSE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            depth = int(pb_utils.get_input_tensor_by_name(request, "DEPTH").as_numpy()[0])
            levels = 1
            if depth > 0:
                inner = pb_utils.InferenceRequest(
                    model_name="recurse",
                    inputs=[pb_utils.Tensor("DEPTH", np.array([depth - 1], np.int32))],
                    requested_output_names=["LEVELS"],
                ).exec()
                if inner.has_error():
                    raise pb_utils.TritonModelException(inner.error().message())
                levels += int(pb_utils.get_output_tensor_by_name(inner, "LEVELS").as_numpy()[0])
            out = pb_utils.Tensor("LEVELS", np.array([levels], np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

_RECURSE_CONFIG = """
name: "recurse"
backend: "python"
input [ { name: "DEPTH" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "LEVELS" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``expand`` (its output as large as asked: inline or in the stub's arena), ``sum``
    (its input as large as sent: inline or in the worker's arena) and ``recurse`` (BLS calls
    to itself) beside the test models this file uses."""
    root = tmp_path_factory.mktemp("direct")
    for name, model, config in (
        ("expand", _EXPAND, _EXPAND_CONFIG),
        ("sum", _SUM, _SUM_CONFIG),
        ("recurse", _RECURSE, _RECURSE_CONFIG),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(model)
    for name in ("slow", "raiser", "error_response", "crasher"):
        (root / name).symlink_to(TEST_MODELS / name)
    (root / "identity").symlink_to(BUNDLED / "identity")
    return root


def _start(repo: Path, *extra: str, metrics: bool = False) -> ShoalServer:
    args = ("--frontend-workers", str(WORKERS), "--model-control-mode", "explicit")
    args += ("--load-model", "*")
    return ShoalServer(repo, extra_args=(*args, *extra), metrics=metrics)


#: Each stub's output arena: 4 MiB at first, 16 MiB at most (a dozen 1.2 MB answers).
_SMALL_ARENAS = (
    "--backend-config",
    "python,shm-default-byte-size=4194304",
    "--backend-config",
    "python,shm-limit-byte-size=16777216",
)


@pytest.fixture(scope="module")
def server(repo: Path):
    with _start(repo, *_SMALL_ARENAS, metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def _expand(module, client, count: int) -> np.ndarray:
    tensor = module.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], np.int32))
    return client.infer("expand", [tensor]).as_numpy("OUT")


def _success(server: ShoalServer, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"]), int(stats["execution_count"])
    finally:
        client.close()


def _metric(server: ShoalServer, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _each_worker_and_protocol(server: ShoalServer) -> Iterator[tuple[Any, Any]]:
    """(client module, client) over HTTP then gRPC, through each worker in turn."""
    for index in range(WORKERS):
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            with through(server, index):
                client = module.InferenceServerClient(url)
                assert client.is_server_live()  # connected through worker ``index``
            try:
                yield module, client
            finally:
                client.close()


def test_each_worker_routes_plain_requests_straight_with_exact_statistics(server):
    before = _success(server, "expand")
    metric_before = _metric(server, "nv_inference_request_success", "expand")
    sent = 0
    for module, client in _each_worker_and_protocol(server):
        # 4 outputs travel inline in the Result; 300,000 (1.2 MB) in the stub's arena, read
        # in place by the worker and given back
        for count in (4, 300_000, 4, 300_000):
            out = _expand(module, client, count)
            np.testing.assert_array_equal(out, np.arange(count, dtype=np.float32))
            sent += 1
    assert server.output.count(ROUTED) == WORKERS, server.output  # one route per worker
    success, executions = _success(server, "expand")
    assert (success - before[0], executions - before[1]) == (sent, sent)
    assert _metric(server, "nv_inference_request_success", "expand") - metric_before == sent


def test_many_large_answers_leave_the_stub_arena_reusable(server):
    """The blocks of every direct answer go back: 200 answers of 1.2 MB each (240 MB) fit in
    the two stubs' arenas (16 MiB at most each) only if they are reused."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(200):
            assert _expand(grpcclient, client, 300_000).shape == (300_000,)
    finally:
        client.close()


def _sum(module, client, x: np.ndarray) -> float:
    tensor = module.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return float(client.infer("sum", [tensor]).as_numpy("SUM")[0])


def _echo(module, client, x: np.ndarray) -> np.ndarray:
    tensor = module.InferInput("IN_FP32", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("identity", [tensor]).as_numpy("OUT_FP32")


def test_large_inputs_go_from_the_worker_arena_straight_to_the_stub(repo: Path):
    """Inputs too large to travel inline are staged in the worker's arena, whose segments the
    core gives each stub once; the worker frees each block when its Result comes, or once the
    response is written where the model answered with its input as it is (``identity``: the
    output is the input's block): 160 inputs of 1.2 MB (192 MB) fit in a 16 MiB arena only if
    they are reused (a full arena would send them inline through the core, and say so)."""
    x = np.arange(300_000, dtype=np.float32)
    expected = float(x.sum(dtype=np.float64))
    with _start(repo, *_SMALL_ARENAS, "--log-verbose", "1") as server:
        before = _success(server, "sum")
        sent = 0
        for module, client in _each_worker_and_protocol(server):
            for _ in range(20):
                assert _sum(module, client, x) == expected
                np.testing.assert_array_equal(_echo(module, client, x), x)
                sent += 1
        success, executions = _success(server, "sum")
        assert (success - before[0], executions - before[1]) == (sent, sent)
        assert "lends input segment" in server.output, server.output
        assert "worker arena full" not in server.output


def _error(module, url: str, model: str) -> str:
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], np.float32))
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [tensor])
        return f"{raised.value.status()} {raised.value.message()}"
    finally:
        client.close()


def test_model_errors_read_as_through_the_core(repo: Path, server):
    with _start(repo, "--direct-dispatch", "false") as core_only:
        for model in ("raiser", "error_response"):
            for module, attr in ((httpclient, "url"), (grpcclient, "grpc_url")):
                direct = _error(module, getattr(server, attr), model)
                assert direct == _error(module, getattr(core_only, attr), model)
        assert ROUTED not in core_only.output
    assert "intentional failure in execute" in _error(httpclient, server.url, "raiser")


def _slow(url: str, seconds: float, results: queue.Queue) -> None:
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    try:
        results.put(float(client.infer("slow", [tensor]).as_numpy("SECONDS_OUT")[0]))
    except InferenceServerException as error:
        results.put(error)
    finally:
        client.close()


def test_an_unload_waits_for_the_requests_sent_straight_to_the_stub(tmp_path: Path):
    """Four instances of ``slow``, so that the unload begins only once all four requests are
    executing (each says so): a request that had not reached the server by then would rightly
    be refused, and the test would race its own threads."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    config = (TEST_MODELS / "slow" / "config.pbtxt").read_text()
    (tmp_path / "slow" / "config.pbtxt").write_text(
        config + "instance_group [ { count: 4 kind: KIND_CPU } ]\n"
    )
    (tmp_path / "slow" / "1" / "model.py").symlink_to(TEST_MODELS / "slow" / "1" / "model.py")
    with _start(tmp_path) as server:
        results: queue.Queue = queue.Queue()
        mark = len(server.output)
        threads = [
            threading.Thread(target=_slow, args=(server.url, 1.0, results)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while server.output[mark:].count("slow: executing") < 4:
            assert time.monotonic() < deadline, server.output[mark:]
            time.sleep(0.02)  # polling the server log
        client = httpclient.InferenceServerClient(server.url)
        try:
            client.unload_model("slow")
            for thread in threads:
                thread.join(60)
            answers = [results.get_nowait() for _ in threads]
            assert answers == [1.0] * 4, answers
            assert not client.is_model_ready("slow")
        finally:
            client.close()


def _recurse(module, client, depth: int) -> int:
    tensor = module.InferInput("DEPTH", [1], "INT32")
    tensor.set_data_from_numpy(np.array([depth], np.int32))
    return int(client.infer("recurse", [tensor]).as_numpy("LEVELS")[0])


def test_a_model_that_calls_itself_is_not_handed_its_own_call(server):
    """The instance running a request sent straight to it waits on its BLS call: the core,
    which saw no request of its own there, must not give that call to it (it would wait for
    itself) but to another instance, at every level of the recursion."""
    for module, client in _each_worker_and_protocol(server):
        for depth in (1, 3, 2, 3):
            assert _recurse(module, client, depth) == depth + 1


def test_calls_of_concurrent_requests_find_a_free_instance(server):
    """Two clients at once, one connected to each worker, each request two levels deep: four
    instances are enough for both chains whichever instances the workers pick."""
    clients = []
    for index in (0, 1):
        with through(server, index):  # the connection is made by the first request
            # Each its own connection: gRPC shares one between channels to the same address.
            own = [("grpc.use_local_subchannel_pool", 1)]
            clients.append(grpcclient.InferenceServerClient(server.grpc_url, channel_args=own))
            assert _recurse(grpcclient, clients[-1], 1) == 2
    failures: queue.Queue = queue.Queue()

    def chains(client) -> None:
        try:
            for _ in range(15):
                got = _recurse(grpcclient, client, 1)
                if got != 2:
                    failures.put(got)
        except Exception as error:  # reported below, with the server's output
            failures.put(error)

    threads = [threading.Thread(target=chains, args=(client,)) for client in clients]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for client in clients:
            client.close()
    assert not any(thread.is_alive() for thread in threads), server.output[-3000:]
    assert failures.empty(), (list(failures.queue), server.output[-3000:])


def test_a_stub_that_dies_fails_its_request_and_its_instance_comes_back(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def crash(flag: int) -> np.ndarray:
        tensor = grpcclient.InferInput("CRASH", [1], "INT32")
        tensor.set_data_from_numpy(np.array([flag], np.int32))
        return client.infer("crasher", [tensor]).as_numpy("PID")

    try:
        crash(0)
        with pytest.raises(InferenceServerException) as raised:
            crash(1)
        assert "UNAVAILABLE" in raised.value.status() or "unavailable" in str(raised.value)
        deadline = time.monotonic() + 60
        answered = 0
        while answered < 10:  # the other instance answers, then both once it has restarted
            assert time.monotonic() < deadline, server.output[-3000:]
            try:
                crash(0)
                answered += 1
            except InferenceServerException:
                time.sleep(0.05)  # polling: the instance restarts
    finally:
        client.close()


def test_a_worker_killed_is_replaced_and_requests_go_on(repo: Path):
    with _start(repo) as server:
        first = worker_pids(server)
        for url in (server.url, server.url):  # routes granted to whichever worker answers
            client = httpclient.InferenceServerClient(url)
            _expand(httpclient, client, 300_000)
            client.close()
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while len(set(worker_pids(server)) - set(first)) < 1:
            assert time.monotonic() < deadline, server.output[-3000:]
            time.sleep(0.05)  # polling the process table for the restarted worker
        answered = 0
        while answered < 20:
            assert time.monotonic() < deadline, server.output[-3000:]
            client = httpclient.InferenceServerClient(server.url)
            try:
                out = _expand(httpclient, client, 300_000)
                np.testing.assert_array_equal(out, np.arange(300_000, dtype=np.float32))
                answered += 1
            except (InferenceServerException, ConnectionError):
                time.sleep(0.05)  # a connection to the worker that is restarting
            finally:
                client.close()
