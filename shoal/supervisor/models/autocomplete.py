"""Run a Python model's ``auto_complete_config`` in a throw-away stub process, as Triton does.

A TorchScript model cannot be completed: its file records neither datatypes nor shapes, so,
as in Triton, its configuration must list its inputs and outputs
(:func:`require_pytorch_config`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb

PYTORCH_BACKEND = "pytorch"
PYTORCH_PLATFORM = "pytorch_libtorch"

#: Seconds a model's auto_complete_config may take.
TIMEOUT_S = 60.0


def wants_auto_complete(model_file: Path) -> bool:
    """Only models that define ``auto_complete_config`` pay for the extra process."""
    try:
        return "auto_complete_config" in model_file.read_text(errors="replace")
    except OSError:
        return False


async def auto_complete(
    model_file: Path,
    proto: pb.ModelConfig,
    python: str = sys.executable,
    *,
    runtime: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> pb.ModelConfig:
    """The configuration after the model's ``auto_complete_config``; raises ConfigError.

    ``model_file`` is the version's ``model.py`` (``get_model_dir()`` is its directory);
    ``runtime`` the ``model.py`` of the model's Python-based backend, which runs instead;
    ``python`` and ``env`` those of the model's own environment (``EXECUTION_ENV_PATH``), where
    it has one, so that imports only that environment has work here too.
    """
    # Triton's form (every field without presence printed: "input": [] where none is written),
    # which models index; those fields parse back to the same message.
    given = json.dumps(model_config.config_to_json(proto))
    ran = runtime or model_file  # the file whose code runs, named in errors
    command = _command(python, model_file, runtime)
    out = await _run(command, given.encode(), {**os.environ, **(env or {})}, ran)
    try:
        return model_config.json_to_config(json.loads(out))
    except (ValueError, model_config.ConfigError) as error:
        raise model_config.ConfigError(
            f"auto_complete_config of '{ran}' returned an invalid configuration: {error}"
        ) from None


def _command(python: str, model_file: Path, runtime: Path | None) -> list[str]:
    command = [python, "-m", "shoal.stub.autocomplete", str(model_file)]
    return command if runtime is None else [*command, str(runtime)]


async def _run(command: list[str], given: bytes, env: dict[str, str], ran: Path) -> bytes:
    """What the auto-complete process printed; ConfigError when it failed or took too long."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(given), TIMEOUT_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise model_config.ConfigError(
            f"auto_complete_config of '{ran}' did not finish within {TIMEOUT_S:.0f}s"
        ) from None
    if process.returncode != 0:
        raise model_config.ConfigError(
            f"auto_complete_config of '{ran}' failed:\n{err.decode(errors='replace')}"
        )
    return out


def is_pytorch_model(path: str | Path, proto: pb.ModelConfig) -> bool:
    """Whether the model of ``proto`` (in ``path``) runs on the PyTorch backend."""
    if proto.backend or proto.platform:
        return proto.backend == PYTORCH_BACKEND or (
            not proto.backend and proto.platform == PYTORCH_PLATFORM
        )
    detected = model_config.detect_backend(Path(path), proto.default_model_filename)
    return detected == PYTORCH_BACKEND


def require_pytorch_config(path: str | Path, proto: pb.ModelConfig, model: str) -> None:
    """Raise ConfigError for a TorchScript model whose configuration lacks inputs or outputs."""
    if not is_pytorch_model(path, proto) or (proto.input and proto.output):
        return
    missing = " and ".join(
        kind for kind, given in (("inputs", proto.input), ("outputs", proto.output)) if not given
    )
    raise model_config.ConfigError(
        f"unable to load model '{model}': a TorchScript model (backend \"pytorch\") cannot be "
        f"auto-completed, because the file records no datatypes or shapes: its config.pbtxt "
        f"must list the {missing} (name, data_type, dims) and max_batch_size, as Triton "
        "requires for PyTorch models",
        field_path=("input",) if not proto.input else ("output",),
    )
