"""Behaviour that follows Triton's: ``async def execute`` runs one batch at a time unless the
model opts into more, a BLS ``timeout`` is a queue timeout (UNAVAILABLE), ``get_model_dir()``
works in ``auto_complete_config``, and thread counts are set only when a model asks."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

# Reports the most executes that ran at once inside its one instance.
ASYNC_PEAK = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.running = 0
        self.peak = 0

    async def execute(self, requests):
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.3)  # the other requests are queued or running by now
        self.running -= 1
        peak = pb_utils.Tensor("PEAK", np.array([self.peak], dtype=np.int32))
        return [pb_utils.InferenceResponse([peak]) for _ in requests]
"""

# Sleeps SECONDS, then answers; its auto_complete_config checks get_model_dir().
SLEEPER = """
import json
import os
import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        here = os.path.dirname(os.path.abspath(__file__))
        if pb_utils.get_model_dir() != here:
            raise RuntimeError(f"get_model_dir() is {pb_utils.get_model_dir()!r}, not {here!r}")
        config.add_output({"name": "THREADS", "data_type": "TYPE_STRING", "dims": [3]})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            pb_utils.Logger.log_info(f"sleeper: sleeping {seconds:.1f}")
            time.sleep(seconds)
            names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
            threads = np.array([os.environ.get(n, "").encode() for n in names], np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("THREADS", threads)]))
        return responses
"""

# Calls sleeper through BLS with TIMEOUT_US and answers the call's error code and message.
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            timeout = int(pb_utils.get_input_tensor_by_name(request, "TIMEOUT_US").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="sleeper",
                inputs=[pb_utils.Tensor("SECONDS", seconds)],
                requested_output_names=["THREADS"],
                timeout=timeout,
            )
            error = call.exec().error()
            codes = {getattr(pb_utils.TritonError, n): n for n in ("UNAVAILABLE", "INTERNAL")}
            code = None if error is None else codes.get(error.code(), error.code())
            text = "ok" if error is None else f"{code}:{error.message()}"
            out = pb_utils.Tensor("RESULT", np.array([text.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


# Answers its request's trace context, and the one a BLS call it passes the trace to sees.
TRACED = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _text(name, value):
    if isinstance(value, str) or value is None:
        value = (value or "").encode()
    return pb_utils.Tensor(name, np.array([value], dtype=np.object_))


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            context = request.trace().get_context()
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0] == 0:
                responses.append(
                    pb_utils.InferenceResponse([_text("CONTEXT", context), _text("CHILD", "")])
                )
                continue
            call = pb_utils.InferenceRequest(
                model_name="traced",
                inputs=[pb_utils.Tensor("IN", np.array([0], dtype=np.int32))],
                requested_output_names=["CONTEXT"],
                trace=request.trace(),
            )
            child = pb_utils.get_output_tensor_by_name(call.exec(), "CONTEXT").as_numpy()[0]
            responses.append(
                pb_utils.InferenceResponse([_text("CONTEXT", context), _text("CHILD", child)])
            )
        return responses
"""
TRACED_IO = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "CONTEXT" data_type: TYPE_STRING dims: [ 1 ] },\n'
    '         { name: "CHILD" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    "instance_group [ { count: 2 kind: KIND_CPU } ]\n"  # one free for its own BLS call
)


def _model(repo: Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("semantics")
    peak_io = (
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "PEAK" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    _model(repo, "async_one_at_a_time", ASYNC_PEAK, peak_io)
    _model(
        repo,
        "async_overlapping",
        ASYNC_PEAK,
        peak_io + 'parameters { key: "async_execute_concurrency" value { string_value: "4" } }\n',
    )
    _model(
        repo,
        "sleeper",
        SLEEPER,
        'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "SHOAL_THREADS_PER_INSTANCE" value { string_value: "3" } }\n'
        'parameters { key: "MKL_NUM_THREADS" value { string_value: "5" } }\n',
    )
    _model(
        repo,
        "caller",
        CALLER,
        'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] },\n'
        '        { name: "TIMEOUT_US" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]\n',
    )
    _model(repo, "traced", TRACED, TRACED_IO)
    with ShoalServer(repo) as running:
        yield running


def _peak(server: ShoalServer, model: str) -> int:
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    try:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        pending = [client.async_infer(model, [tensor]) for _ in range(4)]
        return max(int(p.get_result(timeout=60).as_numpy("PEAK")[0]) for p in pending)
    finally:
        client.close()


def test_async_execute_runs_one_batch_at_a_time_unless_the_model_asks(server):
    assert _peak(server, "async_one_at_a_time") == 1
    assert _peak(server, "async_overlapping") >= 2


def _inputs(seconds: float, timeout_us: int = 0) -> list[httpclient.InferInput]:
    duration = httpclient.InferInput("SECONDS", [1], "FP32")
    duration.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    if not timeout_us:
        return [duration]
    timeout = httpclient.InferInput("TIMEOUT_US", [1], "INT64")
    timeout.set_data_from_numpy(np.array([timeout_us], dtype=np.int64))
    return [duration, timeout]


def _call(client: httpclient.InferenceServerClient, seconds: float, timeout_us: int) -> str:
    result = client.infer("caller", _inputs(seconds, timeout_us))
    return str(result.as_numpy("RESULT")[0].decode())


def _wait_for_log(server: ShoalServer, line: str, after: int) -> None:
    deadline = time.monotonic() + 30  # a loaded CI machine can take seconds to log
    while line not in server.output[after:] and time.monotonic() < deadline:
        # Polling the log for the model's own line. gevent's sleep, not time's: the HTTP
        # client's async_infer sends its request from a greenlet, which only runs while this
        # thread yields to gevent (it yields 10 ms itself, not enough on a loaded machine).
        gevent.sleep(0.01)
    assert line in server.output[after:], server.output[after:]


def test_a_bls_timeout_is_a_queue_timeout(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    other = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        # sleeper is idle: the call starts at once and may run past its 0.2 s.
        assert _call(client, 0.6, 200_000) == "ok"
        # sleeper's only instance is busy for 2 s: the call waits in its queue past 0.2 s.
        mark = len(server.output)
        busy = other.async_infer("sleeper", _inputs(2.0))
        _wait_for_log(server, "sleeper: sleeping 2.0", mark)
        started = time.monotonic()
        text = _call(client, 0.0, 200_000)
        waited = time.monotonic() - started
        busy.get_result(timeout=30)
    finally:
        client.close()
        other.close()
    assert text == "UNAVAILABLE:Request timeout expired", text
    assert waited < 1.5, waited  # answered at the deadline, not when the instance freed up


def test_thread_counts_are_set_when_the_model_asks(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        result = client.infer("sleeper", _inputs(0.0))
        config = client.get_model_config("sleeper")  # completed by auto_complete_config
    finally:
        client.close()
    omp, mkl, openblas = (v.decode() for v in result.as_numpy("THREADS"))
    assert mkl == "5"  # the variable's own parameter wins
    assert omp == os.environ.get("OMP_NUM_THREADS", "3")
    assert openblas == os.environ.get("OPENBLAS_NUM_THREADS", "3")
    assert [o["name"] for o in config["output"]] == ["THREADS"]


def _contexts(server: ShoalServer, call_child: bool) -> list[str]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1 if call_child else 0], dtype=np.int32))
        result = client.infer("traced", [tensor])
    finally:
        client.close()
    return [result.as_numpy(name)[0].decode() for name in ("CONTEXT", "CHILD")]


def test_request_trace_has_no_context_while_tracing_is_off(server):
    assert _contexts(server, call_child=False) == ["", ""]


def test_request_trace_carries_a_context_when_tracing_is_on(tmp_path):
    _model(tmp_path, "traced", TRACED, TRACED_IO)
    flags = ("--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS")
    with ShoalServer(tmp_path, extra_args=(*flags, "--trace-config", "rate=1")) as running:
        first, second = _contexts(running, call_child=False)[0], _contexts(running, True)
        parent = json.loads(first)["traceparent"]
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", parent), parent
        # Each request has its own trace; a BLS call given request.trace() shares its caller's.
        assert json.loads(second[0])["traceparent"] != parent
        assert second[1] == second[0]
