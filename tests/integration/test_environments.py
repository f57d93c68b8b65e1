"""EXECUTION_ENV_PATH: a model's stubs (and its auto_complete_config) run on its environment.

As on Triton, the environment need hold only numpy: shoal lends the stub its msgpack and
posix_ipc. The environments here are venvs whose site-packages link to the server's numpy
(fast to build), one packed as a tarball, whose ``bin/python`` and numpy are absolute links.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

MODEL = """
import os
import sys

import msgpack
import numpy as np
import triton_python_backend_utils as pb_utils

import only_in_env  # the environment's own module: at import, in auto_complete_config too


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        here = os.path.dirname(os.path.abspath(__file__))
        if pb_utils.get_model_dir() != here:
            raise RuntimeError(f"get_model_dir() is {pb_utils.get_model_dir()!r}, not {here!r}")
        for name in only_in_env.OUTPUTS:
            config.add_output({"name": name, "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def execute(self, requests):
        facts = {
            "PREFIX": sys.prefix,
            "LIBRARIES": os.environ.get("LD_LIBRARY_PATH", ""),
            "MSGPACK": os.path.dirname(msgpack.__file__),
        }
        tensors = [
            pb_utils.Tensor(name, np.array([value.encode()], dtype=np.object_))
            for name, value in facts.items()
        ]
        return [pb_utils.InferenceResponse(tensors) for _ in requests]
"""

ONLY_IN_ENV = 'OUTPUTS = ["PREFIX", "LIBRARIES", "MSGPACK"]\n'


def _model(repo: Path, name: str, env_path: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
        f"{json.dumps(env_path)} }} }}\n"
    )


def _venv(path: Path, *, numpy: bool) -> Path:
    """A venv holding only numpy (linked from the server's) and ``only_in_env``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = path / "lib" / version / "site-packages"
    (site / "only_in_env.py").write_text(ONLY_IN_ENV)
    if numpy:
        origin = Path(np.__file__).resolve().parent
        for package in (origin, origin.with_name("numpy.libs")):
            if package.exists():
                (site / package.name).symlink_to(package, target_is_directory=True)
    return path


def _tarball(env: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env, arcname=".")  # links stay links: bin/python and numpy are absolute ones
    return archive


@pytest.fixture
def env_cache(tmp_path, monkeypatch):
    cache = tmp_path / "env-cache"
    monkeypatch.setenv("SHOAL_ENV_CACHE", str(cache))  # the server inherits it
    return cache


def _facts(client: httpclient.InferenceServerClient, model: str) -> dict[str, str]:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
    result = client.infer(model, [tensor])
    return {name: result.as_numpy(name)[0].decode() for name in ("PREFIX", "LIBRARIES", "MSGPACK")}


def test_an_environment_holding_only_numpy_serves_as_a_venv_and_as_a_tarball(tmp_path, env_cache):
    repo = tmp_path / "repo"
    venv = _venv(tmp_path / "numpy_only", numpy=True)
    _model(repo, "in_venv", "$$TRITON_MODEL_DIRECTORY/../../numpy_only")
    packed = _venv(tmp_path / "packed", numpy=True)
    _model(repo, "in_tarball", str(_tarball(packed, tmp_path / "packed.tar.gz")))
    with ShoalServer(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            for model in ("in_venv", "in_tarball"):
                config = client.get_model_config(model)  # completed on the environment
                assert [o["name"] for o in config["output"]] == ["PREFIX", "LIBRARIES", "MSGPACK"]
            facts = _facts(client, "in_venv")
            assert Path(facts["PREFIX"]).resolve() == venv.resolve()
            first = Path(facts["LIBRARIES"].split(os.pathsep)[0])
            assert first.resolve() == venv.resolve() / "lib"
            assert Path(facts["MSGPACK"]).is_relative_to(env_cache)  # lent by the server
            unpacked = Path(_facts(client, "in_tarball")["PREFIX"])
            assert unpacked.is_relative_to(env_cache) and (unpacked / "bin" / "python").is_symlink()
        finally:
            client.close()


def test_environments_that_cannot_host_the_stub_fail_the_load_clearly(tmp_path, env_cache):
    repo = tmp_path / "repo"
    _venv(tmp_path / "no_numpy", numpy=False)
    _model(repo, "no_numpy", str(tmp_path / "no_numpy"))
    broken = tmp_path / "broken" / "bin"
    broken.mkdir(parents=True)
    (broken / "python").write_text("#!/bin/sh\necho 'not a python' >&2\nexit 1\n")
    (broken / "python").chmod(0o755)
    _model(repo, "broken", str(tmp_path / "broken"))
    _model(repo, "missing", str(tmp_path / "nowhere"))
    with ShoalServer(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        finally:
            client.close()
    assert all(index[m]["state"] == "UNAVAILABLE" for m in ("no_numpy", "broken", "missing"))
    assert "has no numpy" in index["no_numpy"]["reason"]
    assert "install numpy into it" in index["no_numpy"]["reason"]
    assert "cannot host shoal's stub: not a python" in index["broken"]["reason"]
    assert "is not a Python environment" in index["missing"]["reason"]
