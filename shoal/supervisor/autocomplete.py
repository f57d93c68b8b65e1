"""Run a Python model's ``auto_complete_config`` in a throw-away stub process, as Triton does."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb

#: Seconds a model's auto_complete_config may take.
TIMEOUT_S = 60.0


def wants_auto_complete(model_file: Path) -> bool:
    """Only models that define ``auto_complete_config`` pay for the extra process."""
    try:
        return "auto_complete_config" in model_file.read_text(errors="replace")
    except OSError:
        return False


async def auto_complete(
    model_file: Path, proto: pb.ModelConfig, python: str = sys.executable
) -> pb.ModelConfig:
    """The configuration after the model's ``auto_complete_config``; raises ConfigError."""
    given = json.dumps(model_config.config_to_json(proto, include_defaults=False))
    process = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "shoal.stub.autocomplete",
        str(model_file),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(given.encode()), TIMEOUT_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise model_config.ConfigError(
            f"auto_complete_config of '{model_file}' did not finish within {TIMEOUT_S:.0f}s"
        ) from None
    if process.returncode != 0:
        raise model_config.ConfigError(
            f"auto_complete_config of '{model_file}' failed:\n{err.decode(errors='replace')}"
        )
    try:
        return model_config.json_to_config(json.loads(out))
    except (ValueError, model_config.ConfigError) as error:
        raise model_config.ConfigError(
            f"auto_complete_config of '{model_file}' returned an invalid configuration: {error}"
        ) from None
