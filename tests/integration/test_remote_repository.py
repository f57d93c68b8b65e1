"""``--model-repository s3://...`` against a real S3 API: moto's server on a loopback port.

The server reads credentials, region and endpoint from the environment (AWS_*), as it would
with AWS or MinIO; the tests upload with boto3, never through shoal's own code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, REPO_ROOT, ShoalServer

pytestmark = pytest.mark.timeout(120)

# The test extras install boto3 and moto; without them (a GPU machine with only what it carries)
# the module is skipped, not an error that stops the whole run.
boto3 = pytest.importorskip("boto3")

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "shoal-test",
    "AWS_SECRET_ACCESS_KEY": "shoal-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MotoServer:
    """``moto_server`` on a free loopback port (it prints the port it bound)."""

    def __init__(self, **env: str) -> None:
        self.env = {**os.environ, **env}
        self.log = tempfile.NamedTemporaryFile(prefix="shoal-moto-", suffix=".log")
        self.proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", "0"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )
        self.endpoint = self._wait_for_endpoint()

    def _wait_for_endpoint(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(
                r"Running on (http://127\.0\.0\.1:\d+)", Path(self.log.name).read_text()
            )
            if found:
                return found[1]
            assert self.proc.poll() is None, Path(self.log.name).read_text()
            time.sleep(0.02)  # polling the log for the bound port, not waiting on time
        raise TimeoutError(f"moto_server did not start:\n{Path(self.log.name).read_text()}")

    @property
    def hostport(self) -> str:
        return self.endpoint.removeprefix("http://")

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.close()


@pytest.fixture
def s3_env(moto: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The server's environment: credentials, region and endpoint; a private TMPDIR, returned."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    tmp = tmp_path / "server-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def _upload(s3, bucket: str, prefix: str, model_dir: Path, name: str = "") -> None:
    name = name or model_dir.name
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            key = f"{prefix}/{name}/{path.relative_to(model_dir).as_posix()}"
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def _delete(s3, bucket: str, prefix: str) -> None:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    for item in listed.get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=item["Key"])


def _bucket_with(moto: MotoServer, bucket: str, *models: str) -> None:
    s3 = moto.client()
    s3.create_bucket(Bucket=bucket)
    for model in models:
        _upload(s3, bucket, "models", BUNDLED / model)


def _set_instance_count(moto: MotoServer, bucket: str, count: int) -> None:
    config = (
        (BUNDLED / "add_sub" / "config.pbtxt").read_text().replace("count: 1", f"count: {count}")
    )
    moto.client().put_object(Bucket=bucket, Key="models/add_sub/config.pbtxt", Body=config.encode())


def _instance_count(client: httpclient.InferenceServerClient) -> int:
    groups = client.get_model_config("add_sub")["instance_group"]
    return int(sum(g["count"] for g in groups))


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)  # polling the server's state, which the repository poller changes


def _add_sub(client: httpclient.InferenceServerClient) -> np.ndarray:
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.arange(4, dtype=np.float32))
    inputs[1].set_data_from_numpy(np.full(4, 10, dtype=np.float32))
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def test_serves_models_from_s3_and_removes_the_temporary_cache(moto, s3_env):
    _bucket_with(moto, "serve", "add_sub", "string_upper")
    with ShoalServer("s3://serve/models") as server:
        client = httpclient.InferenceServerClient(server.url)
        np.testing.assert_array_equal(_add_sub(client), [10, 11, 12, 13])
        assert client.is_model_ready("string_upper")
        client.close()
        cached = [p.name for p in s3_env.iterdir()]
        assert any(name.startswith("shoal-repositories-") for name in cached), cached
        assert server.stop() == 0
    assert not any(p.name.startswith("shoal-repositories-") for p in s3_env.iterdir())


def test_poll_mode_follows_the_bucket(moto, s3_env):
    _bucket_with(moto, "poll", "add_sub")
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with ShoalServer("s3://poll/models", extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("add_sub")

        _upload(moto.client(), "poll", "models", BUNDLED / "string_upper")
        _wait_until(lambda: client.is_model_ready("string_upper"), "string_upper is loaded")

        _set_instance_count(moto, "poll", 2)
        _wait_until(lambda: _instance_count(client) == 2, "add_sub is reloaded with 2 instances")
        np.testing.assert_array_equal(_add_sub(client), [10, 11, 12, 13])

        _delete(moto.client(), "poll", "models/string_upper")
        _wait_until(
            lambda: "string_upper" not in {m["name"] for m in client.get_model_repository_index()},
            "string_upper leaves the repository index",
        )
        assert client.is_model_ready("add_sub")
        client.close()


def test_explicit_load_resyncs_and_the_cache_dir_is_reused(moto, s3_env, tmp_path):
    """Triton's s3://host:port/bucket/path form, with no endpoint in the environment."""
    os.environ.pop("AWS_ENDPOINT_URL")  # monkeypatch restores it
    _bucket_with(moto, "explicit", "add_sub")
    url = f"s3://{moto.hostport}/explicit/models"
    cache = tmp_path / "cache"
    args = ("--model-control-mode", "explicit", "--load-model", "add_sub")
    args += ("--model-repository-cache", str(cache))
    with ShoalServer(url, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert _instance_count(client) == 1
        _set_instance_count(moto, "explicit", 2)
        _upload(moto.client(), "explicit", "models", BUNDLED / "identity")
        assert _instance_count(client) == 1  # nothing is polled in explicit mode

        client.load_model("add_sub")
        assert _instance_count(client) == 2
        client.load_model("identity")
        assert client.is_model_ready("identity")
        client.close()
        assert "downloaded 'add_sub'" in server.output

    # The persistent cache is kept, and a restart downloads nothing that did not change.
    assert (cache / next(p.name for p in cache.iterdir()) / "add_sub" / "config.pbtxt").is_file()
    with ShoalServer(url, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert _instance_count(client) == 2
        client.close()
        assert "downloaded" not in server.output


def _serve_fails(url: str, env: dict[str, str]) -> str:
    """Run ``shoal serve`` expecting it to exit non-zero at start; its output."""
    args = ["serve", "--model-repository", url, "--http-address", "127.0.0.1", "--http-port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.cli", *args, "--allow-grpc", "false", "--allow-metrics", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "SHOAL_LISTENING" not in proc.stdout
    return proc.stderr


def test_missing_bucket_and_empty_prefix_fail_at_start(moto, s3_env):
    _bucket_with(moto, "empty")
    error = _serve_fails("s3://no-such-bucket/models", {})
    assert "'s3://no-such-bucket/models'" in error
    assert "bucket does not exist" in error
    error = _serve_fails("s3://empty/models", {})
    assert "'s3://empty/models' has no model directories" in error


def test_bad_credentials_fail_at_start(s3_env):
    """A second moto server that checks credentials: the test's keys are unknown to it."""
    checking = MotoServer(INITIAL_NO_AUTH_ACTION_COUNT="0")
    try:
        error = _serve_fails("s3://secured/models", {"AWS_ENDPOINT_URL": checking.endpoint})
    finally:
        checking.close()
    assert "'s3://secured/models' cannot be listed" in error
    assert "PermissionError" in error
