"""scripts/repository_extras.py: the framework extras `make serve` installs for a repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "repository_extras.py"
BUNDLED = SCRIPT.parents[1] / "model_repository"

pytestmark = pytest.mark.timeout(30)


def _extras(*repositories: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, repositories)],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return done.stdout.strip()


def _model(repo: Path, name: str, config: str | None, model_file: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / model_file).write_bytes(b"")


def test_python_models_need_no_extra() -> None:
    assert _extras(BUNDLED) == ""


def test_backends_platforms_and_model_files_name_their_extra(tmp_path: Path) -> None:
    _model(tmp_path, "by_backend", 'backend: "onnxruntime"\n', "model.onnx")
    _model(tmp_path, "by_platform", 'platform: "pytorch_libtorch"\n', "model.pt")
    assert _extras(tmp_path) == "onnx,torch"
    other = tmp_path / "other"
    _model(other, "no_config", None, "model.pt")  # auto-completed from the file
    _model(other, "python", 'backend: "python"\n', "model.py")
    assert _extras(other) == "torch"
    assert _extras(BUNDLED, other) == "torch"
