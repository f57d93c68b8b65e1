"""SHOAL_REQUIREMENTS: a model's requirements.txt becomes a cached venv its stubs run on."""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(240)

PACKAGE = "shoal_reqtest_pkg"
WHEEL = f"{PACKAGE}-1.0-py3-none-any.whl"

MODEL = f"""
import sys

import numpy as np
import triton_python_backend_utils as pb_utils
import {PACKAGE}


class TritonPythonModel:
    def execute(self, requests):
        found = np.array([{PACKAGE}.VALUE.encode(), sys.prefix.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("FOUND", found)]) for _ in requests]
"""


def _wheel(path: Path) -> None:
    """A one-module wheel, written by hand so that no build tool or network is needed."""
    files = {
        f"{PACKAGE}/__init__.py": b'VALUE = "installed from requirements.txt"\n',
        f"{PACKAGE}-1.0.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode()
        ),
        f"{PACKAGE}-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{PACKAGE}-1.0.dist-info/RECORD,,")
    files[f"{PACKAGE}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)


def _model(repo: Path, name: str, requirement: str) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    _wheel(version / WHEEL)
    (version / "requirements.txt").write_text(f"{requirement}\n")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "FOUND" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        'parameters { key: "SHOAL_REQUIREMENTS" value: { string_value: "requirements.txt" } }\n'
    )


def test_requirements_become_one_cached_venv_and_failures_show_pip(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHOAL_ENV_CACHE", str(cache))
    repo = tmp_path / "repo"
    # Two models with the same requirements load at once: one venv is built, both use it.
    _model(repo, "req_a", f"./{WHEEL}")
    _model(repo, "req_b", f"./{WHEEL}")
    _model(repo, "req_broken", "./no-such-package-1.0-py3-none-any.whl")
    with ShoalServer(repo, timeout=180) as server:
        client = httpclient.InferenceServerClient(server.url)
        inp = httpclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
        prefixes = set()
        for name in ("req_a", "req_b"):
            value, prefix = client.infer(name, [inp]).as_numpy("FOUND")
            assert value.decode() == "installed from requirements.txt"
            prefixes.add(Path(prefix.decode()).resolve())
        venvs = sorted(p for p in cache.iterdir() if p.name.startswith("venv-") and p.is_dir())
        assert len(venvs) == 1, venvs
        assert prefixes == {venvs[0].resolve()}
        with pytest.raises(InferenceServerException, match="no-such-package") as failure:
            client.infer("req_broken", [inp])
        assert "installing" in str(failure.value), failure.value
        client.close()
        # The build's progress is in the log: started, pip's lines, how long it took.
        log = server.output
        assert "building its environment from" in log
        assert f"pip: Processing ./{WHEEL}" in log or "pip: Successfully installed" in log, log
        assert re.search(r"environment built in \d+\.\d s", log), log
