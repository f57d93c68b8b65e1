"""tritonserver's flags that shoal honours, end to end: ``--id``, ``--model-config-name``,
``--disable-auto-complete-config``, ``--model-load-retry-count``, header forwarding over HTTP
and gRPC, ``--metrics-config``, the deprecated ``--trace-*`` flags, and ``--reuse-*-port``."""

from __future__ import annotations

import json
import queue
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

#: A model that answers with its request's parameters (``request.parameters()``, a JSON text).
PARAMS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", text)]))
        return responses
"""

PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "chosen" value {{ string_value: "{}" }} }}
"""

#: A model with no config.pbtxt that completes its own (auto-complete).
SELF_COMPLETING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""

#: A model whose first initialize fails (it leaves a mark), and whose second succeeds.
FLAKY_MODEL = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        mark = os.path.join(args["model_repository"], "tried-once")
        if not os.path.exists(mark):
            open(mark, "w").close()
            raise pb_utils.TritonModelException("the first try fails")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""

FORWARD = "fwd-.*"
HEADERS = {"fwd-tenant": "blue", "other": "not forwarded"}


def _model(repo: Path, name: str, code: str, config: str | None) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_flags")
    params = _model(repo, "params", PARAMS_MODEL, PARAMS_CONFIG.format("config.pbtxt"))
    (params / "configs").mkdir()
    (params / "configs" / "custom.pbtxt").write_text(PARAMS_CONFIG.format("custom"))
    (params / "configs" / "other.pbtxt").write_text(PARAMS_CONFIG.format("other"))
    plain = _model(repo, "plain", PARAMS_MODEL, PARAMS_CONFIG.format("config.pbtxt"))
    (plain / "configs").mkdir()
    (plain / "configs" / "other.pbtxt").write_text(PARAMS_CONFIG.format("other"))
    _model(repo, "self_completing", SELF_COMPLETING_MODEL, None)
    _model(repo, "flaky", FLAKY_MODEL, 'backend: "python"\nmax_batch_size: 0\n')
    return repo


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    flags = (
        "--id=my-triton",
        "--model-config-name",
        "custom",
        "--disable-auto-complete-config",
        "--model-load-retry-count=1",
        f"--http-header-forward-pattern={FORWARD}",
        "--grpc-header-forward-pattern",
        FORWARD,
        "--metrics-config",
        "counter_latencies=false",
        f"--trace-file={trace_file}",
        "--trace-level=TIMESTAMPS",
        "--trace-rate",
        "7",
        # Accepted and ignored, as scripts written for tritonserver pass them.
        "--grpc-infer-thread-count=4",
        "--model-load-thread-count=2",
        "--host-policy=gpu0,numa-node=0",
        "--allow-sagemaker=false",
    )
    with ShoalServer(repo, extra_args=flags, metrics=True) as server:
        yield server


def test_id_is_the_server_name_on_http_and_grpc(server: ShoalServer) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert http.get_server_metadata()["name"] == "my-triton"
        assert grpc.get_server_metadata().name == "my-triton"
    finally:
        http.close()
        grpc.close()


def test_model_config_name_chooses_the_custom_config_where_it_exists(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        chosen = {
            name: client.get_model_config(name)["parameters"]["chosen"]["string_value"]
            for name in ("params", "plain")
        }
    finally:
        client.close()
    assert chosen == {"params": "custom", "plain": "config.pbtxt"}


def test_disable_auto_complete_config_requires_a_config(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    finally:
        client.close()
    entry = index["self_completing"]
    assert entry["state"] == "UNAVAILABLE", entry
    assert "--disable-auto-complete-config" in entry["reason"], entry


def test_a_model_that_failed_to_load_is_tried_again(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.is_model_ready("flaky")
    finally:
        client.close()
    assert "the first try fails" in server.output


def _parameters(
    server: ShoalServer, headers: dict[str, str], protocol: str = "http"
) -> dict[str, object]:
    """The request parameters the ``params`` model saw, as it answers them."""
    module, url = (httpclient, server.url) if protocol == "http" else (grpcclient, server.grpc_url)
    client = module.InferenceServerClient(url)
    try:
        tensor = module.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        result = client.infer("params", [tensor], headers=headers)
    finally:
        client.close()
    return json.loads(result.as_numpy("PARAMS")[0])  # type: ignore[index]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_matching_headers_become_request_parameters(server: ShoalServer, protocol: str) -> None:
    # The pattern ignores case; gRPC metadata keys are lowercase (grpcio refuses others).
    region = "FWD-Region" if protocol == "http" else "fwd-region"
    headers = {"fwd-tenant": "blue", region: "eu", "other": "not forwarded"}
    parameters = _parameters(server, headers, protocol)
    # HTTP header names keep the client's case, as Triton (libevhtp) forwards them.
    assert parameters == {"fwd-tenant": "blue", region: "eu"}, parameters


def test_pipelined_http_requests_forward_each_its_own_header_names(server: ShoalServer) -> None:
    # Two requests in one write: the second's head is read while the first is served, and
    # each request's scope keeps its own lines.
    body = json.dumps(
        {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    ).encode()
    heads = [
        f"POST /v2/models/params/infer HTTP/1.1\r\nHost: x\r\n{name}: {value}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        for name, value in (("Fwd-First", "1"), ("FWD-SECOND", "2"))
    ]
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"".join(head + body for head in heads))
        answers = _read_responses(conn, 2)
    seen = [json.loads(answer["outputs"][0]["data"][0]) for answer in answers]
    assert seen == [{"Fwd-First": "1"}, {"FWD-SECOND": "2"}], seen


def _read_responses(conn: socket.socket, count: int) -> list[dict[str, object]]:
    """``count`` HTTP/1.1 JSON answers read from ``conn`` (each with a Content-Length)."""
    data, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, "connection closed early"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(data) < length:
            chunk = conn.recv(65536)
            assert chunk, "connection closed early"
            data += chunk
        answers.append(json.loads(data[:length]))
        data = data[length:]
    return answers


def test_a_stream_forwards_its_metadata_to_every_request(server: ShoalServer) -> None:
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: answers.put(error or result), headers=HEADERS)
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        for _ in range(2):
            client.async_stream_infer("params", [tensor])
        results = [answers.get(timeout=60) for _ in range(2)]
        client.stop_stream()
    finally:
        client.close()
    for result in results:
        assert isinstance(result, grpcclient.InferResult), result
        assert json.loads(result.as_numpy("PARAMS")[0]) == {"fwd-tenant": "blue"}  # type: ignore[index]


def test_grpcio_server_forwards_metadata_too(repo: Path) -> None:
    flags = ("--grpc-server=grpcio", f"--grpc-header-forward-pattern={FORWARD}")
    flags += ("--model-control-mode=explicit", "--load-model=params")
    with ShoalServer(repo, extra_args=flags) as grpcio_server:
        assert _parameters(grpcio_server, HEADERS, "grpc") == {"fwd-tenant": "blue"}


def test_counter_latencies_false_drops_the_duration_counters(server: ShoalServer) -> None:
    _parameters(server, {})
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    assert 'nv_inference_count{model="params",version="1"}' in text
    assert "nv_inference_request_duration_us" not in text
    assert "nv_inference_queue_duration_us" not in text


def test_deprecated_trace_flags_set_the_trace_settings(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        settings = client.get_trace_settings()
    finally:
        client.close()
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "7"
    assert settings["trace_file"].endswith("trace.json")
    assert "'--trace-rate' has been deprecated" in server.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_reuse_port_lets_two_servers_share_the_ports(repo: Path) -> None:
    http_port, grpc_port = _free_port(), _free_port()
    ports = ("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    flags = ("--model-control-mode=explicit", *ports)
    shared = (*flags, "--reuse-http-port=true", "--reuse-grpc-port", "true")
    with ShoalServer(repo, extra_args=shared) as first, ShoalServer(repo, extra_args=shared):
        assert first.http_port == http_port and first.grpc_port == grpc_port
        alone = ShoalServer(repo, extra_args=flags)
        try:
            with pytest.raises(RuntimeError, match="already in use"):
                alone.start()
        finally:
            alone.log.close()
            Path(alone.log.name).unlink()
