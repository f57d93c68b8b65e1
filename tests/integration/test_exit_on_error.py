"""``--exit-on-error`` (Triton's default, true) for every way a model can fail to load, and what
a failed load tells the log (the model's traceback, once) and clients (one line, no paths)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, REPO_ROOT, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

PYTHON_CONFIG = 'backend: "python"\n'
SYNTAX_ERROR = "class TritonPythonModel:\n    def initialize(self, args)\n        pass\n"


def _raising_initialize(repo: Path) -> str:
    shutil.copytree(TEST_MODELS / "init_fail", repo / "init_fail")
    return "NameError: name 'lorem_ipsum' is not defined (model.py line 3, in initialize)"


def _syntax_error(repo: Path) -> str:
    (repo / "syntax_error" / "1").mkdir(parents=True)
    (repo / "syntax_error" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (repo / "syntax_error" / "1" / "model.py").write_text(SYNTAX_ERROR)
    return "SyntaxError: expected ':' (model.py, line 2)"


def _failed_environment(repo: Path) -> str:
    shutil.copytree(BUNDLED / "identity", repo / "no_env")
    config = repo / "no_env" / "config.pbtxt"
    config.write_text(
        config.read_text().replace('name: "identity"', 'name: "no_env"')
        + 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
        '"$TRITON_MODEL_DIRECTORY/missing_env.tar.gz" } }\n'
    )
    return "missing_env.tar.gz"


def _broken_config(repo: Path) -> str:
    shutil.copytree(TEST_MODELS / "broken_config", repo / "broken_config")
    return "TYPE_NOT_A_TYPE"


FAILURES: dict[str, Callable[[Path], str]] = {
    "init_fail": _raising_initialize,
    "syntax_error": _syntax_error,
    "no_env": _failed_environment,
    "broken_config": _broken_config,
}


def _repository(tmp_path: Path, broken: str) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(BUNDLED / "add_sub", repo / "add_sub")
    return repo, FAILURES[broken](repo)


def _serve(repo: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "shoal", "serve", "--model-repository", str(repo)]
    args += ["--http-address", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false"]
    args += ["--allow-metrics", "false", *flags]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=90, cwd=REPO_ROOT, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize("broken", sorted(FAILURES))
def test_a_failed_load_exits_by_default(tmp_path: Path, broken: str) -> None:
    repo, expected = _repository(tmp_path, broken)
    done = _serve(repo)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert expected in log, log
    assert f"exiting: 1 model(s) failed to load: {broken} (--exit-on-error=true" in log
    # The model table, as tritonserver prints it, comes before the exit.
    assert "| Model " in log and "| add_sub " in log and "| READY" in log
    assert f"| {broken} " in log
    assert "SHOAL_LISTENING" not in log  # it never served
    assert "shoal is ready" not in log


@pytest.mark.parametrize("broken", ["init_fail", "syntax_error"])
def test_the_traceback_is_logged_once_with_the_models_frames_only(
    tmp_path: Path, broken: str
) -> None:
    repo, _ = _repository(tmp_path, broken)
    done = _serve(repo)
    log = done.stdout + done.stderr  # INFO lines on stdout, the traceback on stderr
    assert log.count("Traceback (most recent call last)") == 1, log
    assert log.count(f"failed to load '{broken}' version 1") == 1, log
    assert f"{repo}/{broken}/1/model.py" in log  # the operator sees where
    assert "shoal/stub" not in log and "importlib" not in log, log
    assert "died with" not in log, log  # a failed initialize is no crash
    assert "loading 'add_sub' version 1: 1 instance of" in log
    assert re.search(r"loaded 'add_sub' version 1 in \d+\.\d\d s", log), log
    assert re.search(r"successfully loaded 'add_sub'(?! version)", log), log  # Triton's line


@pytest.mark.parametrize("broken", sorted(FAILURES))
def test_without_exit_on_error_clients_get_the_reason_without_paths(
    tmp_path: Path, broken: str
) -> None:
    repo, expected = _repository(tmp_path, broken)
    with ShoalServer(repo, exit_on_error=False) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            assert client.is_model_ready("add_sub")
            assert not client.is_model_ready(broken)
            assert not client.is_server_ready()  # --strict-readiness: a model is missing
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata(broken)
            message = info.value.message()
        finally:
            client.close()
    assert broken in message and expected in message, message
    assert "Traceback" not in message and str(tmp_path) not in message, message


def test_a_failed_reload_keeps_the_model_and_the_server_ready() -> None:
    # What model-analyzer does in remote mode: it loads configurations one after the other,
    # some of which cannot load here (KIND_GPU without a GPU), and waits for a ready server.
    args = ("--model-control-mode", "explicit", "--load-model", "add_sub")
    with ShoalServer(BUNDLED, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            config = client.get_model_config("add_sub")
            config["instance_group"] = [{"kind": "KIND_GPU", "count": 1}]
            with pytest.raises(InferenceServerException) as info:
                client.load_model("add_sub", config=json.dumps(config))
            assert "KIND_GPU" in info.value.message()
            assert client.is_server_ready() and client.is_model_ready("add_sub")
            index = {e["name"]: e for e in client.get_model_repository_index()}
            assert index["add_sub"]["state"] == "READY"
        finally:
            client.close()


class _NotLiveServer(ShoalServer):
    """A server expected to come up not live: started once its metadata answers."""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.02)  # polling the endpoint, not waiting on time
        raise TimeoutError(f"shoal serve did not answer within {self.timeout}s:\n{self.output}")


@pytest.mark.parametrize("missing_first", [True, False])
def test_an_unreadable_repository_without_exit_on_error_serves_not_live(
    tmp_path: Path, missing_first: bool
) -> None:
    # Triton with --exit-on-error=false: its endpoints start, health says neither live nor ready
    # (SERVER_FAILED_TO_INITIALIZE, whatever --strict-readiness), metadata answers, nothing loads.
    repo, _ = _repository(tmp_path, "init_fail")
    missing = tmp_path / "missing"
    repos = (missing, repo) if missing_first else (repo, missing)
    with _NotLiveServer(*repos, extra_args=("--strict-readiness", "false")) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for client in (http, grpc):
                assert not client.is_server_live()
                assert not client.is_server_ready()
                assert not client.is_model_ready("add_sub")
            assert http.get_server_metadata()["name"] == "triton"
            assert grpc.get_server_metadata().name == "triton"
        finally:
            http.close()
            grpc.close()
        assert f"model repository '{missing}' is not a directory" in server.output


def test_a_failed_explicit_load_answers_in_tritons_words(tmp_path: Path) -> None:
    repo, expected = _repository(tmp_path, "init_fail")
    args = ("--model-control-mode", "explicit", "--load-model", "add_sub")
    with ShoalServer(repo, extra_args=args) as server:
        for client in (
            httpclient.InferenceServerClient(server.url),
            grpcclient.InferenceServerClient(server.grpc_url),
        ):
            try:
                with pytest.raises(InferenceServerException) as info:
                    client.load_model("init_fail")
            finally:
                client.close()
            message = info.value.message()
            # Triton's "load failed for model 'm': ...", then the version and its reason.
            assert message.startswith("load failed for model 'init_fail': "), message
            assert "failed to load 'init_fail' version 1: " + expected in message, message


def test_a_startup_model_not_in_the_repository_is_logged_in_tritons_words(tmp_path: Path) -> None:
    repo, _ = _repository(tmp_path, "init_fail")
    done = _serve(repo, "--model-control-mode", "explicit", "--load-model", "does-not-exist")
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "failed to poll model 'does-not-exist': model not found in any model repository." in log
