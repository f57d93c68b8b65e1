"""A stub that answers and then dies: what it wrote whole before dying reaches the client.

The models here send their answers and kill themselves right after (SIGKILL): a decoupled model
sends its responses and its FINAL flag, then dies in the same execute; a plain model (the
default scheduler: with frontend workers, sent straight to the stub) and a batched one (the
dynamic batcher) return their responses, and a thread kills the stub a moment later. Before the
answers, each model logs enough lines that the reader is still busy with the stub's ring when
the death is seen. Every answer must come back whole and once, the requests the stub had not
answered fail naming the instance, the instance comes back, and the dead stub's output arena is
unmapped everywhere once its answers are written.
"""

from __future__ import annotations

import queue
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import FRONTEND_WORKERS, ShoalServer
from tests.integration.test_frontend_workers import stub_arenas, worker_pids

pytestmark = pytest.mark.timeout(180)

#: Log lines a model writes before its answers: the reader takes a few turns over them.
LOGS = 3000

_COMMON = """
import os, signal, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils


def flood(count):
    logger = pb_utils.Logger
    for i in range(count):
        logger.log_info(f"line {i} before the answers")


def die_soon():
    def kill():
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


def wanted(request):
    die = pb_utils.get_input_tensor_by_name(request, "DIE").as_numpy()
    size = pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()
    return int(die.flat[0]), int(size.flat[0])
"""

_PLAIN = (
    _COMMON
    + """

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        dies = False
        for request in requests:
            die, size = wanted(request)
            dies = dies or bool(die)
            out = np.full(size, float(os.getpid()), np.float32)
            if pb_utils.get_input_tensor_by_name(request, "DIE").as_numpy().ndim == 2:
                out = out.reshape(1, -1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        if dies:
            flood(LOGS)
            die_soon()
        return responses
"""
)

_DECOUPLED = (
    _COMMON
    + """

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            die, size = wanted(request)
            sender = request.get_response_sender()
            if die:
                flood(LOGS)
            for i in range(size):
                out = pb_utils.Tensor("OUT", np.array([i], np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            if die == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if die:  # 1: after the FINAL flag, 2: before it
                os.kill(os.getpid(), signal.SIGKILL)
        return None
"""
)


def _config(name: str, batch: int, extra: str = "") -> str:
    return textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {batch}
        input [
          {{ name: "DIE" data_type: TYPE_INT32 dims: [ 1 ] }},
          {{ name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] }}
        ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {extra}
        """
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stub_death")
    models = {
        "plain_dies": (_PLAIN, _config("plain_dies", 0)),
        "batched_dies": (
            _PLAIN,
            _config("batched_dies", 8, "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
        ),
        "stream_dies": (
            _DECOUPLED,
            _config("stream_dies", 0, "model_transaction_policy { decoupled: true }"),
        ),
    }
    for name, (model, config) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(model.replace("LOGS", str(LOGS)))
        (root / name / "config.pbtxt").write_text(config)
    return root


#: With frontend workers, the server runs once with direct dispatch (the default) and once
#: without (every request through the core); with one worker, the core serves every request.
_DISPATCH = ["default", "through-core"] if int(FRONTEND_WORKERS or "1") > 1 else ["default"]


@pytest.fixture(scope="module", params=_DISPATCH)
def server(request: pytest.FixtureRequest, repo: Path) -> Iterator[ShoalServer]:
    """The models, served as ``_DISPATCH`` says."""
    extra = ("--direct-dispatch", "false") if request.param == "through-core" else ()
    with ShoalServer(repo, extra_args=extra) as srv:
        yield srv


def _inputs(module, die: int, size: int, batched: bool = False) -> list:
    shape = [1, 1] if batched else [1]
    tensors = []
    for name, value in (("DIE", die), ("SIZE", size)):
        tensor = module.InferInput(name, shape, "INT32")
        tensor.set_data_from_numpy(np.full(shape, value, np.int32))
        tensors.append(tensor)
    return tensors


def _stub_of(server: ShoalServer, model: str) -> int:
    """The pid of the model's one stub, once it runs (it restarts after each death)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in server.stub_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue  # it has just exited
            if f"{model}_0_0".encode() in args:
                return pid
        time.sleep(0.05)  # polling: the instance restarts
    raise AssertionError(f"no stub of {model}:\n{server.output[-3000:]}")


def _until_ready(server: ShoalServer, model: str, dead: int) -> None:
    """Wait until ``model`` has a stub other than ``dead`` and answers again."""
    client = httpclient.InferenceServerClient(server.url)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert time.monotonic() < deadline, server.output[-3000:]
            if _stub_of(server, model) != dead and client.is_model_ready(model):
                return
            time.sleep(0.05)  # polling: the instance restarts
    finally:
        client.close()


def _arena_released(server: ShoalServer, arenas: set[int]) -> None:
    """No process of the server maps the dead stub's output arena any more."""
    pids = [server.proc.pid, *worker_pids(server)] if server.proc else []
    deadline = time.monotonic() + 30
    while True:
        held = {pid: stub_arenas(pid) & arenas for pid in pids}
        if not any(held.values()):
            return
        assert time.monotonic() < deadline, f"the dead stub's arena is still mapped: {held}"
        time.sleep(0.05)  # polling: the answers are written, then the arena is let go


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("size", [4, 1 << 18], ids=["inline", "in-arena"])
def test_a_plain_answer_written_before_the_death_is_delivered(
    server: ShoalServer, protocol: str, size: int
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    try:
        stub = _stub_of(server, "plain_dies")
        arenas = stub_arenas(stub)
        result = client.infer("plain_dies", _inputs(module, 1, size))
        out = result.as_numpy("OUT")
        assert out.shape == (size,) and (out == float(stub)).all()
        _until_ready(server, "plain_dies", stub)
        _arena_released(server, arenas)
        again = client.infer("plain_dies", _inputs(module, 0, size)).as_numpy("OUT")
        assert again.shape == (size,) and again[0] != float(stub)
    finally:
        client.close()
    assert "Stub process 'plain_dies_0_0' is not healthy" in server.output


@pytest.mark.parametrize("size", [4, 1 << 18], ids=["inline", "in-arena"])
def test_a_batch_answered_before_the_death_is_delivered(server: ShoalServer, size: int) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    try:
        stub = _stub_of(server, "batched_dies")
        arenas = stub_arenas(stub)
        for index in range(4):  # one batch (the batcher waits 20 ms); the last one dies
            client.async_infer(
                "batched_dies",
                _inputs(grpcclient, int(index == 3), size, batched=True),
                callback=lambda result, error: answers.put((result, error)),
            )
        for _ in range(4):
            result, error = answers.get(timeout=60)
            assert error is None, error
            out = result.as_numpy("OUT")
            assert out.shape == (1, size) and (out == float(stub)).all()
        _until_ready(server, "batched_dies", stub)
        _arena_released(server, arenas)
    finally:
        client.close()


def _stream_dies(
    server: ShoalServer, die: int, count: int
) -> tuple[grpcclient.InferenceServerClient, queue.Queue, int]:
    """A stream to ``stream_dies`` with one request sent (``die``: when the model dies, as
    :func:`_inputs` says); its answers go to the queue as ``(result, error)``; the stub's pid."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    stub = _stub_of(server, "stream_dies")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "stream_dies", _inputs(grpcclient, die, count), enable_empty_final_response=True
        )
    except BaseException:
        client.stop_stream()
        client.close()
        raise
    return client, answers, stub


@pytest.mark.parametrize("count", [1, 2000])
def test_a_stream_answered_before_the_death_is_delivered(server: ShoalServer, count: int) -> None:
    client, answers, stub = _stream_dies(server, 1, count)
    try:
        got = []
        while True:
            result, error = answers.get(timeout=60)
            assert error is None, (error, len(got))
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.get_response().outputs:
                got.append(int(result.as_numpy("OUT")[0]))
            if final:
                break
        assert got == list(range(count))
    finally:
        client.stop_stream()
        client.close()
    _until_ready(server, "stream_dies", stub)
    assert answers.empty(), answers.get_nowait()


@pytest.mark.parametrize("count", [1, 2000])
def test_a_stream_cut_before_its_final_gets_its_answers_then_the_error(
    server: ShoalServer, count: int
) -> None:
    client, answers, stub = _stream_dies(server, 2, count)
    try:
        got = []
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                break
            assert result.get_response().outputs, "a final response from a stub that died"
            got.append(int(result.as_numpy("OUT")[0]))
        assert "Stub process 'stream_dies_0_0' is not healthy" in str(error), error
        assert got == list(range(count))
    finally:
        client.stop_stream()
        client.close()
    _until_ready(server, "stream_dies", stub)
    assert answers.empty(), answers.get_nowait()
    # The error went down the stream, not into a future nobody awaits (asyncio's complaint).
    assert "Future exception was never retrieved" not in server.output, server.output[-3000:]
