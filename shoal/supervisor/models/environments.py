"""Per-model Python environments (``EXECUTION_ENV_PATH``), as Triton's Python backend has them.

The parameter names a conda-pack ``.tar.gz`` (unpacked once into a cache keyed by the archive's
content hash), an unpacked environment or a venv; ``$$TRITON_MODEL_DIRECTORY`` stands for the
model's directory. The stub runs on that environment's interpreter; shoal's own package is made
importable through a directory that holds only a link to it, so nothing else of the server's
environment leaks in. As on Triton, the environment need provide only numpy: shoal lends the
stub its own msgpack and posix_ipc (used only where the environment has none), puts the
environment's ``lib/`` on ``LD_LIBRARY_PATH``, and runs the model's ``auto_complete_config`` on
the environment's interpreter too.

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

import msgpack
import posix_ipc

import shoal
from shoal.core.errors import InvalidArgument
from shoal.supervisor.models import venvs

PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIR_TOKEN = "$$TRITON_MODEL_DIRECTORY"


@dataclass(frozen=True)
class StubEnvironment:
    python: str
    env: dict[str, str]


def cache_root() -> Path:
    return Path(os.environ.get("SHOAL_ENV_CACHE", Path(tempfile.gettempdir()) / "shoal-envs"))


def _links(kind: str, targets: list[Path]) -> Path:
    """A cache directory holding only links to ``targets`` (by their names), made once per
    set of targets: servers of different installs share the cache root safely."""
    key = hashlib.sha256("\0".join(map(str, targets)).encode()).hexdigest()[:16]
    directory = cache_root() / kind / key
    if (directory / ".complete").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for target in targets:
        link = directory / target.name
        if not link.is_symlink():
            tmp = directory / f".{target.name}-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target, target_is_directory=target.is_dir())
            os.replace(tmp, link)
    (directory / ".complete").touch()
    return directory


def _shim_dir() -> Path:
    """A directory holding only a link named ``shoal`` to this package: it goes first on the
    stub's path, so nothing else of the server's environment leaks in."""
    return _links("shim", [Path(shoal.__file__).resolve().parent])


def _dependencies_dir() -> Path:
    """Links to the server's builds of the stub's own dependencies (msgpack, posix_ipc). The
    stub puts this directory last on its path (``SHOAL_STUB_FALLBACK_PATH``): an environment
    that has its own copies uses those, one holding only numpy (all Triton asks of it) uses
    these. msgpack falls back to pure Python on another Python version; posix_ipc's build loads
    only on the server's version, so such an environment must bring its own."""
    targets = []
    for module in (msgpack, posix_ipc):
        origin = Path(str(module.__file__)).resolve()
        targets.append(origin.parent if origin.name == "__init__.py" else origin)
    return _links("stub-deps", targets)


def _digest(archive: Path) -> str:
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unpack(archive: Path) -> Path:
    target = cache_root() / _digest(archive)[:32]
    if (target / ".unpacked").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix="unpack-", dir=cache_root()))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter=_keep_absolute_links)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (target / ".unpacked").touch()
    return target


def _keep_absolute_links(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's "data" filter, except that a symbolic link may point to an absolute path.

    Environments hold such links (a venv's ``bin/python``, links into the prefix a conda
    environment was built in) and Triton unpacks them as they are. The link's own name must
    still lie inside the destination, and "data" still refuses any member that would be written
    through a link to outside it.
    """
    if member.issym() and os.path.isabs(member.linkname):
        checked = tarfile.data_filter(member.replace(linkname=".", deep=False), dest)
        return checked.replace(linkname=member.linkname, deep=False)
    return tarfile.data_filter(member, dest)


def resolve(parameters: Mapping[str, str], model_dir: str, model: str) -> StubEnvironment | None:
    """The interpreter and environment variables for a model's stubs, or None for the server's."""
    raw = parameters.get(PARAMETER)
    if not raw:
        return None
    path = _located(raw, model_dir)
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


def _located(raw: str, model_dir: str) -> Path:
    """The path ``EXECUTION_ENV_PATH`` names; relative paths are within the model directory."""
    path = Path(raw.replace(_MODEL_DIR_TOKEN, model_dir)).expanduser()
    return path if path.is_absolute() else Path(model_dir) / path


def _variables(path: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": str(_shim_dir()),
        "SHOAL_STUB_FALLBACK_PATH": str(_dependencies_dir()),
        "PATH": f"{path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": _library_path(path),
        "VIRTUAL_ENV": str(path),
    }


def _library_path(path: Path) -> str:
    """As Triton does: the environment's shared libraries (conda's libstdc++, MKL) first."""
    libraries = os.environ.get("LD_LIBRARY_PATH", "")
    return f"{path / 'lib'}{os.pathsep}{libraries}" if libraries else str(path / "lib")


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
        environment = await _venv(requirements, parameters, model)
    if environment is not None:
        await check(environment, model)
    return environment


async def _venv(requirements: Path, parameters: Mapping[str, str], model: str) -> StubEnvironment:
    """The virtual environment built (or found in the cache) for ``requirements``."""
    timeout = venvs.build_timeout(parameters, model)
    path = await venvs.build(requirements, cache_root(), model, timeout)
    return StubEnvironment(str(path / "bin" / "python"), _variables(path))


#: Run on the environment's interpreter before its stubs start: it exits 3 when that Python is
#: too old for the stub, 4 without numpy (the one package the environment must provide), and
#: fails on anything else the stub cannot import. Written for any Python, 2 included.
_PROBE = """
import sys
if sys.version_info < (3, 10):
    sys.stdout.write("Python %d.%d" % tuple(sys.version_info[:2]))
    sys.exit(3)
try:
    import numpy
except ImportError as error:
    sys.stdout.write(str(error))
    sys.exit(4)
import shoal.stub.runtime, shoal.stub.autocomplete
"""


async def check(environment: StubEnvironment, model: str) -> None:
    """Fail the load with a clear message if the environment cannot run a stub."""
    where = f"model '{model}': the Python environment of {environment.python}"
    try:
        process = await asyncio.create_subprocess_exec(
            environment.python,
            "-c",
            _PROBE,
            env={**os.environ, **environment.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        raise InvalidArgument(f"{where} cannot be started: {error.strerror}") from None
    out, err = await process.communicate()
    said = out.decode(errors="replace").strip()
    if process.returncode == 3:
        raise InvalidArgument(f"{where} is {said}; shoal's stub needs Python 3.10 or newer")
    if process.returncode == 4:
        raise InvalidArgument(
            f"{where} has no numpy ({said}): install numpy into it (shoal provides the stub's "
            "other dependencies)"
        )
    if process.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise InvalidArgument(f"{where} cannot host shoal's stub: {last[0]}")


def server_python() -> str:
    return sys.executable
