"""Beyond Triton: a venv built from a model's ``requirements.txt`` (model parameter
``SHOAL_REQUIREMENTS``).

The venv is built once per content of the requirements file and Python version, in the same cache
as unpacked conda-pack archives, and reused by every model that names the same requirements.
A file lock makes concurrent loads (in this server or another) wait for one build instead of
racing. The venv sees the server's site-packages after its own (a ``.pth`` line), so the stub's
numpy, msgpack and posix_ipc are there while the model's requirements take precedence. A failed
or slow build fails the load with the tail of pip's output.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from shoal.core.errors import InvalidArgument

PARAMETER = "SHOAL_REQUIREMENTS"
TIMEOUT_PARAMETER = "SHOAL_REQUIREMENTS_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT = 600.0
_MODEL_DIR_TOKEN = "$$TRITON_MODEL_DIRECTORY"
_DONE = ".shoal-complete"
_TAIL_LINES = 15
#: pip's lines that tell a build's progress in the server log (the rest only on failure).
_PROGRESS = ("Collecting", "Processing", "Building", "Installing", "Successfully")

log = logging.getLogger("shoal")


def requirements_file(
    parameters: Mapping[str, str], model_dir: str, version_dir: str, model: str
) -> Path | None:
    """The requirements file a model asks for: a relative name is looked up next to
    ``model.py`` (the version directory), then in the model directory."""
    raw = parameters.get(PARAMETER, "").strip()
    if not raw:
        return None
    path = Path(raw.replace(_MODEL_DIR_TOKEN, model_dir)).expanduser()
    candidates = _candidates(path, model_dir, version_dir)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    where = " or ".join(str(c) for c in candidates)
    raise InvalidArgument(f"model '{model}': {PARAMETER} '{raw}' names no file ({where})")


def _candidates(path: Path, model_dir: str, version_dir: str) -> list[Path]:
    if path.is_absolute():
        return [path]
    return [Path(version_dir) / path, Path(model_dir) / path]


def build_timeout(parameters: Mapping[str, str], model: str) -> float:
    raw = parameters.get(TIMEOUT_PARAMETER, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise InvalidArgument(
            f"model '{model}': {TIMEOUT_PARAMETER} must be a positive number of seconds, "
            f"got '{raw}'"
        )
    return seconds


def venv_key(requirements: Path) -> str:
    """The cache key: the file's content, the interpreter's version and where it lives."""
    digest = hashlib.sha256(requirements.read_bytes())
    digest.update(sys.version.encode())
    digest.update(sys.executable.encode())
    return digest.hexdigest()[:32]


async def build(requirements: Path, cache: Path, model: str, timeout: float) -> Path:
    """The venv for ``requirements`` under ``cache``, built first if no complete one exists."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"venv-{venv_key(requirements)}"
    if (target / _DONE).exists():
        return target
    lock = await asyncio.to_thread(_lock, cache / f"{target.name}.lock")
    try:
        if not (target / _DONE).exists():  # another load may have built it while we waited
            loop = asyncio.get_running_loop()
            started = loop.time()
            log.info("model '%s': building its environment from %s", model, requirements)
            await _build(requirements, target, model, timeout)
            log.info(
                "model '%s': environment built in %.1f s (cached in %s)",
                model,
                loop.time() - started,
                target,
            )
    finally:
        os.close(lock)  # releases the lock
    return target


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def _build(requirements: Path, target: Path, model: str, timeout: float) -> None:
    shutil.rmtree(target, ignore_errors=True)  # a build that died half way
    python = target / "bin" / "python"
    steps = [
        ("creating the venv", [sys.executable, "-m", "venv", "--without-pip", str(target)]),
        (
            f"installing {requirements}",
            [
                sys.executable,
                *("-m", "pip", "--python", str(python), "install", "--no-input"),
                *("-r", str(requirements)),
            ],
        ),
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        for what, command in steps:
            await _run(command, requirements.parent, deadline - loop.time(), model, what)
            if what == "creating the venv":
                _see_server_packages(python)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / _DONE).touch()


def _see_server_packages(python: Path) -> None:
    """Append the server's site-packages to the venv's path: the stub's own dependencies."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = python.parent.parent / "lib" / version / "site-packages"
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "zz-shoal-server.pth").write_text("".join(f"{p}\n" for p in paths))


async def _run(command: list[str], cwd: Path, timeout: float, model: str, what: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,  # relative paths in a requirements file are relative to it
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []
    try:
        await asyncio.wait_for(_follow(process, lines, model), max(timeout, 0.001))
    except BaseException as error:  # too slow, or the load was cancelled: no stray pip
        await _kill(process)
        if not isinstance(error, asyncio.TimeoutError):
            raise
        raise InvalidArgument(
            f"model '{model}': {what} took longer than {TIMEOUT_PARAMETER} allows; "
            "the venv was not built"
        ) from None
    _check_exit(process.returncode, lines, model, what)


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()


def _check_exit(returncode: int | None, lines: list[str], model: str, what: str) -> None:
    if returncode != 0:
        tail = "\n".join(lines[-_TAIL_LINES:]) or "(no output)"
        raise InvalidArgument(f"model '{model}': {what} failed (exit {returncode}):\n{tail}")


async def _follow(process: asyncio.subprocess.Process, lines: list[str], model: str) -> None:
    """Read the build's output as it comes: its progress lines go to the log, every line to
    ``lines`` (the failure message quotes the last ones)."""
    assert process.stdout is not None
    async for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        if not line:
            continue
        lines.append(line)
        del lines[: -_TAIL_LINES * 4]
        if line.lstrip().startswith(_PROGRESS):
            log.info("model '%s': pip: %s", model, line.strip())
    await process.wait()
