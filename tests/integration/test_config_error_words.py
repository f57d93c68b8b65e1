"""A configuration tritonserver refuses stops ``shoal serve`` with tritonserver's words on an
``E`` log line (what Triton's qa/L0_model_config greps for), shoal's explanation after them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.server import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4, 0 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# (model, config.pbtxt, Triton's words)
CASES = [
    (
        "zero_dims",
        'backend: "python"\nmax_batch_size: 8\n' + IO,
        "model input 'IN' dimension must be integer >= 1, or -1 to indicate a variable-size "
        "dimension for zero_dims",
    ),
    (
        "runtime_escape",
        'backend: "identity"\nruntime: "../elsewhere/libtriton_identity.so"\n'
        + IO.replace("4, 0", "4"),
        "backend library name '../elsewhere/libtriton_identity.so' escapes backend directory",
    ),
]


def _serve(repo: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "shoal", "serve", "--model-repository", str(repo)]
    args += ["--http-address", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false"]
    args += ["--allow-metrics", "false", "--backend-directory", str(repo.parent), *flags]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=90, cwd=REPO_ROOT, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(("model", "config", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_refused_configuration_stops_the_server_in_tritons_words(
    tmp_path: Path, model: str, config: str, words: str
) -> None:
    repo = tmp_path / "repo"
    (repo / model / "1").mkdir(parents=True)
    (repo / model / "config.pbtxt").write_text(config)
    (repo / model / "1" / "model.py").write_text("")
    done = _serve(repo, "--strict-model-config=true")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if re.match(r"E\d{4} ", line)]
    assert any(words in line for line in errors), done.stderr
    # tritonserver's deprecation warning for the flag, in its words, on stderr
    assert (
        "Warning: '--strict-model-config' has been deprecated! Please use "
        "'--disable-auto-complete-config' instead." in done.stderr
    )
