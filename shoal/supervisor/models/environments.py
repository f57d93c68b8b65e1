"""Per-model Python environments (``EXECUTION_ENV_PATH``), as Triton's Python backend has them.

The parameter names a conda-pack ``.tar.gz`` (unpacked once into a cache keyed by the archive's
content hash), an unpacked environment or a venv; ``$$TRITON_MODEL_DIRECTORY`` stands for the
model's directory. The stub runs on that environment's interpreter; shoal's own package is made
importable through a directory that holds only a link to it, so nothing else of the server's
environment leaks in. The environment must provide numpy, msgpack and posix_ipc.

Beyond Triton, ``SHOAL_REQUIREMENTS`` names a ``requirements.txt`` that shoal turns into a cached
venv (:mod:`shoal.supervisor.models.venvs`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import shoal
from shoal.core.errors import InvalidArgument
from shoal.supervisor.models import venvs

PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIR_TOKEN = "$$TRITON_MODEL_DIRECTORY"
_REQUIRED = ("numpy", "msgpack", "posix_ipc")


@dataclass(frozen=True)
class StubEnvironment:
    python: str
    env: dict[str, str]


def cache_root() -> Path:
    return Path(os.environ.get("SHOAL_ENV_CACHE", Path(tempfile.gettempdir()) / "shoal-envs"))


def _shim_dir() -> Path:
    """A directory holding only a link named ``shoal`` to this package."""
    shim = cache_root() / "shim"
    link = shim / "shoal"
    if not link.exists():
        shim.mkdir(parents=True, exist_ok=True)
        tmp = shim / f".shoal-{os.getpid()}"
        tmp.symlink_to(Path(shoal.__file__).resolve().parent, target_is_directory=True)
        os.replace(tmp, link)
    return shim


def _unpack(archive: Path) -> Path:
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    target = cache_root() / digest.hexdigest()[:32]
    if (target / ".unpacked").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=cache_root()))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (target / ".unpacked").touch()
    return target


def resolve(parameters: Mapping[str, str], model_dir: str, model: str) -> StubEnvironment | None:
    """The interpreter and environment variables for a model's stubs, or None for the server's."""
    raw = parameters.get(PARAMETER)
    if not raw:
        return None
    path = Path(raw.replace(_MODEL_DIR_TOKEN, model_dir)).expanduser()
    if not path.is_absolute():
        path = Path(model_dir) / path
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        cache_root().mkdir(parents=True, exist_ok=True)
        path = _unpack(path)
    python = path / "bin" / "python"
    if not python.exists():
        raise InvalidArgument(
            f"model '{model}': {PARAMETER} '{raw}' is not a Python environment: {python} does not "
            "exist (give a conda-pack .tar.gz, a conda environment or a venv)"
        )
    return StubEnvironment(str(python), _variables(path))


def _variables(path: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": str(_shim_dir()),
        "PATH": f"{path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(path),
    }


async def prepare(
    parameters: Mapping[str, str], model_dir: str, version_dir: str, model: str
) -> StubEnvironment | None:
    """The environment a model's stubs run on (None: the server's), built or unpacked and
    checked; raises InvalidArgument (or OSError) with the reason the load fails."""
    requirements = venvs.requirements_file(parameters, model_dir, version_dir, model)
    if requirements is None:
        environment = resolve(parameters, model_dir, model)
    elif parameters.get(PARAMETER):
        raise InvalidArgument(f"model '{model}': give {PARAMETER} or {venvs.PARAMETER}, not both")
    else:
        timeout = venvs.build_timeout(parameters, model)
        path = await venvs.build(requirements, cache_root(), model, timeout)
        environment = StubEnvironment(str(path / "bin" / "python"), _variables(path))
    if environment is not None:
        await check(environment, model)
    return environment


async def check(environment: StubEnvironment, model: str) -> None:
    """Fail the load with a clear message if the environment cannot run a stub."""
    probe = "; ".join(f"import {name}" for name in _REQUIRED)
    process = await asyncio.create_subprocess_exec(
        environment.python,
        "-c",
        f"{probe}; import shoal.stub",
        env={**os.environ, **environment.env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise InvalidArgument(
            f"model '{model}': the Python environment {environment.python} cannot run shoal's "
            f"stub ({last[0]}); install {', '.join(_REQUIRED)} into it"
        )


def server_python() -> str:
    return sys.executable
