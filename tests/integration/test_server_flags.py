"""``shoal serve`` flags end to end: restricted APIs over HTTP and gRPC, and the logging flags."""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, FRONTEND_WORKERS, REPO_ROOT, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

ADMIN = "--{}=model-repository:admin-key=admin-value"
HTTP_ADMIN = {"admin-key": "admin-value"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}

# Triton's lines: level, time, pid, then the source file and line.
DEFAULT_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+\.py:\d+\] ", re.M)
ISO8601_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ [\w.]+\.py:\d+\] ", re.M)


def _wait_for(read: Callable[[], str], text: str, timeout: float = 30.0) -> str:
    """Poll ``read()`` until it contains ``text``; return what it read."""
    deadline = time.monotonic() + timeout
    while True:
        content = read()
        if text in content or time.monotonic() > deadline:
            assert text in content, f"{text!r} did not appear within {timeout}s:\n{content}"
            return content
        time.sleep(0.02)  # polling a file, not waiting on time


@pytest.fixture(scope="module")
def restricted() -> Iterator[ShoalServer]:
    flags = (ADMIN.format("http-restricted-api"), ADMIN.format("grpc-restricted-protocol"))
    with ShoalServer(BUNDLED, extra_args=flags) as server:
        yield server


def test_http_model_repository_needs_the_header(restricted: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(restricted.url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.get_model_repository_index()
        assert info.value.status() == "403"
        assert info.value.message() == "This API is restricted, expecting header 'admin-key'"
        index = client.get_model_repository_index(headers=HTTP_ADMIN)
        assert {entry["name"] for entry in index} >= {"add_sub", "identity", "string_upper"}
        assert client.is_model_ready("add_sub")  # health is not restricted
    finally:
        client.close()


def test_grpc_model_repository_needs_the_metadata_key(restricted: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.get_model_repository_index(headers=HTTP_ADMIN)  # without Triton's prefix
        assert info.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
        assert info.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        )
        index = client.get_model_repository_index(headers=GRPC_ADMIN, as_json=True)
        assert {m["name"] for m in index["models"]} >= {"add_sub", "identity", "string_upper"}
        assert client.is_server_ready()
    finally:
        client.close()


def test_log_file_takes_the_server_log_and_the_models_output(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    flags = ("--model-control-mode=explicit", "--load-model=slow", "--log-file", str(log_file))
    with ShoalServer(TEST_MODELS, extra_args=flags) as server:
        content = _wait_for(log_file.read_text, "shoal is ready")
        content = _wait_for(log_file.read_text, "[slow_0] slow: hello from stderr")
        assert "[slow_0] slow: hello from stdout" in content
        assert DEFAULT_LINE.search(content), content
        client = httpclient.InferenceServerClient(server.url)
        try:
            settings = client.get_log_settings()
            # The logging extension switches the format of the lines that follow.
            client.update_log_settings({"log_format": "ISO8601"})
            seconds = httpclient.InferInput("SECONDS", [1], "FP32")
            seconds.set_data_from_numpy(np.zeros(1, dtype=np.float32))
            client.infer("slow", [seconds])
        finally:
            client.close()
        assert settings["log_file"] == str(log_file)
        assert settings["log_format"] == "default"
        content = _wait_for(log_file.read_text, "slow: executing")
        executing = next(line for line in content.splitlines() if "slow: executing" in line)
        assert ISO8601_LINE.match(executing), executing
        assert " model.py:" in executing, executing  # the model's own line, as in Triton
        assert server.stop() == 0
        # Only the machine-readable lines stay on stdout.
        assert "SHOAL_LISTENING http" in server.output
        assert "shoal is ready" not in server.output
        assert "hello from" not in server.output


def test_log_format_iso8601() -> None:
    with ShoalServer(BUNDLED, extra_args=("--log-format", "ISO8601")) as server:
        output = _wait_for(lambda: server.output, "shoal is ready")
        assert ISO8601_LINE.search(output), output
        assert not DEFAULT_LINE.search(output), output
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            settings = client.get_log_settings(as_json=True)["settings"]
        finally:
            client.close()
        assert settings["log_format"] == {"string_param": "ISO8601"}


def test_log_levels_can_be_turned_off() -> None:
    flags = ("--log-info=false", "--log-warning", "true", "--log-error=true")
    with ShoalServer(BUNDLED, extra_args=flags) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            settings = client.get_log_settings()
        finally:
            client.close()
        assert server.stop() == 0
        output = server.output
    assert (settings["log_info"], settings["log_warning"], settings["log_error"]) == (
        False,
        True,
        True,
    )
    assert "SHOAL_LISTENING http" in output
    assert "shoal is ready" not in output  # an info line


# An input name that reads as a record of its own (with a terminal escape), as Triton's
# L0_logging injects it; a refused request's verbose "Infer failed" line holds it.
FORGED = "I0205 18:34:18.707423 1 file.cc:123] THIS ENTRY WAS INJECTED \x1b[31mRED\x1b[0m"


def _refused_with_a_forged_input_name(server: ShoalServer) -> None:
    name = f"\n{FORGED}\n{FORGED}"
    data = np.zeros(4, dtype=np.float32)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(data)
            with pytest.raises(InferenceServerException, match="THIS ENTRY WAS INJECTED"):
                client.infer("add_sub", [tensor])
        finally:
            client.close()
    client = grpcclient.InferenceServerClient(server.grpc_url)  # and a ModelStreamInfer request
    answers: queue.Queue[object] = queue.Queue()
    streamed = grpcclient.InferInput(name, [4], "FP32")
    streamed.set_data_from_numpy(data)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error))
        client.async_stream_infer("add_sub", [streamed])
        assert "THIS ENTRY WAS INJECTED" in str(answers.get(timeout=30))
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("escaped", [True, False], ids=["escaped", "unescaped"])
def test_a_clients_text_cannot_forge_a_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, escaped: bool
) -> None:
    """Messages are JSON strings, as Triton's: TRITON_SERVER_ESCAPE_LOG_MESSAGES=0 prints them
    as they are, and the forged line is there."""
    if not escaped:
        monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    log_file = tmp_path / "server.log"
    flags = ("--model-control-mode=explicit", "--load-model=add_sub", "--log-verbose", "1")
    with ShoalServer(BUNDLED, extra_args=(*flags, "--log-file", str(log_file))) as server:
        _wait_for(log_file.read_text, "shoal is ready")
        _refused_with_a_forged_input_name(server)
        deadline = time.monotonic() + 30
        while log_file.read_text().count("Infer failed") < 3:  # HTTP's and gRPC's
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.02)  # polling a file, not waiting on time
    lines = log_file.read_text().splitlines()
    if not escaped:
        assert lines.count(FORGED) == 3, lines  # one forged line per refused request
        return
    assert FORGED not in lines and not any("\x1b" in line for line in lines), lines
    failed = [line for line in lines if "Infer failed" in line]
    for line in failed:
        assert DEFAULT_LINE.match(line) and line.startswith("I"), line  # a verbose line
        message = json.loads(line.split("] ", 1)[1])
        assert message.startswith("[request id: <id_unknown>] Infer failed: ")
        assert f"'\n{FORGED}\n{FORGED}'" in message
    assert len(failed) == 3, lines


@pytest.mark.parametrize("flag, name", [("http", "HTTP"), ("grpc", "GRPC"), ("metrics", "Metrics")])
def test_a_port_in_use_is_logged_in_tritons_words(flag: str, name: str) -> None:
    # Scripts (and Triton's own QA) grep the log for tritonserver's line when a port is taken.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [sys.executable, "-m", "shoal", "serve", "--model-repository", str(BUNDLED)]
        args += ["--model-control-mode", "explicit", "--allow-metrics", "true"]
        args += ["--frontend-workers", FRONTEND_WORKERS]  # the workers bind in the core too
        for endpoint in ("http", "grpc", "metrics"):
            args += [f"--{endpoint}-address", "127.0.0.1"]
            args += [f"--{endpoint}-port", str(port if endpoint == flag else 0)]
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=90,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    text = f"failed to start {name} service: Unavailable - Socket '127.0.0.1:{port}' already in use"
    # An error line with the message as Triton writes it by default (a JSON string).
    assert re.search(rf'^E.*\] "{re.escape(text)}"$', log, re.M), log


def test_a_repository_named_twice_is_read_once() -> None:
    # Triton keeps the repositories in a set: its models are not "in two repositories".
    with ShoalServer(BUNDLED, BUNDLED, exit_on_error=True) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            assert client.is_server_ready() and client.is_model_ready("add_sub")
        finally:
            client.close()
