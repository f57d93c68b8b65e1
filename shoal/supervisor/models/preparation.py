"""From a model directory to the versions to start: read and check ``config.pbtxt`` (with a load
request's override), auto-complete it (the model's own ``auto_complete_config``, an ONNX graph),
and choose the versions its policy names."""

from __future__ import annotations

import json
import logging
import os
import sys
import tarfile
from pathlib import Path

from shoal import config as model_config
from shoal.core.errors import InvalidArgument, ShoalError
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.instances.devices import check_gpu_parameters, visible_gpus
from shoal.supervisor.models import environments, onnx_autocomplete, python_backends
from shoal.supervisor.models.autocomplete import (
    auto_complete,
    require_pytorch_config,
    wants_auto_complete,
)
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.options import ServerOptions

_log = logging.getLogger(__name__)

#: Characters Triton's Python backend refuses in stub (model and instance) names.
SHELL_CHARS = ";|&$`<>()[]{}\\\"'*?~#!"


#: What Triton trims from a model name before it checks it (boost::trim: C's isspace).
_BLANKS = " \t\n\v\f\r"


def check_model_name(name: str) -> None:
    """Refuse, in Triton's words, a name that is blank or would leave the repository, and one
    Triton's Python backend could not name its stub processes after."""
    trimmed = name.strip(_BLANKS)
    if not trimmed:
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise InvalidArgument(
            f"invalid model name '{name}', model name must not contain path traversal characters"
        )
    if any(char in SHELL_CHARS for char in name):
        # Triton's Python backend refuses them in the names of its stub processes.
        raise InvalidArgument(
            f"failed to load '{name}': Invalid stub name: contains invalid characters "
            f"(a model name may not contain any of {SHELL_CHARS})"
        )


def parse_override(name: str, config_json: str | None) -> dict[str, object] | None:
    """The ``config`` parameter of a load request, as a JSON object (None when not given)."""
    if config_json is None:
        return None
    try:
        override = json.loads(config_json)
    except json.JSONDecodeError as error:
        raise InvalidArgument(f"failed to load '{name}': 'config' is not JSON: {error}") from None
    if not isinstance(override, dict):
        raise InvalidArgument(f"failed to load '{name}': 'config' must be a JSON object")
    return override


async def prepare_versions(
    name: str, path: str, override: dict[str, object] | None, options: ServerOptions
) -> list[ModelVersion]:
    """The versions of model ``name`` (in ``path``) to start, not started yet."""
    strict = options.strict_model_config
    source = model_config.read_config(
        path, strict=strict, override=override, config_name=options.model_config_name
    )
    available = model_config.list_versions(path)
    runtime = python_backends.runtime_file(source.proto, options.backend_directory)
    proto = source.proto
    if not strict:
        proto = await _python_auto_complete(name, path, proto, available, runtime)
        proto = await _onnx_auto_complete(name, path, proto, available, options)
    require_pytorch_config(path, proto, name)
    config = model_config.complete_config(source, proto=proto, gpus=visible_gpus())
    for warning in config.warnings:  # settings accepted with no effect: the user should know
        _log.warning("%s", warning)
    check_gpu_parameters(config.parameters, name)
    chosen = model_config.select_versions(config.version_policy, available, model_name=name)
    return _versions(name, config, chosen, runtime)


def _versions(
    name: str, config: model_config.ModelConfig, chosen: list[int], runtime: Path | None
) -> list[ModelVersion]:
    as_json = model_config.config_to_json(config)
    versions = [ModelVersion(name, v, config, as_json) for v in chosen]
    for mv in versions:
        mv.runtime_file = "" if runtime is None else str(runtime)
    return versions


async def _python_auto_complete(
    name: str, path: str, proto: pb.ModelConfig, available: list[int], runtime: Path | None
) -> pb.ModelConfig:
    """The config as the model's ``auto_complete_config`` completes it (run in its own
    environment), when it has one."""
    model_file = _python_model_file(path, proto, available, runtime is not None)
    code = runtime or model_file
    if model_file is None or not code or not wants_auto_complete(code):
        return proto
    environment = await _environment(name, path, proto, model_file)
    python, env = (sys.executable, None) if environment is None else environment
    if not proto.name:  # Triton names the config after its directory before the backend sees it
        named = pb.ModelConfig()
        named.CopyFrom(proto)
        named.name = name
        proto = named
    return await auto_complete(model_file, proto, python, runtime=runtime, env=env)


async def _onnx_auto_complete(
    name: str, path: str, proto: pb.ModelConfig, available: list[int], options: ServerOptions
) -> pb.ModelConfig:
    """The config completed from an ONNX model's graph, when it asks for it."""
    onnx_file = onnx_autocomplete.model_file(path, proto, available)
    if onnx_file is None or not onnx_autocomplete.wants_auto_complete(proto):
        return proto
    default_max_batch = onnx_autocomplete.default_max_batch_size(options.backend_config)
    return await onnx_autocomplete.auto_complete(
        onnx_file, proto, model=name, default_max_batch=default_max_batch
    )


async def _environment(
    name: str, path: str, proto: pb.ModelConfig, model_file: Path
) -> tuple[str, dict[str, str]] | None:
    """The interpreter and variables of the model's own environment, for auto-complete."""
    parameters = {key: value.string_value for key, value in proto.parameters.items()}
    model_dir = os.path.abspath(path)
    try:
        environment = await environments.prepare(
            parameters, model_dir, str(model_file.parent), name
        )
    except (ShoalError, OSError, tarfile.TarError) as error:
        raise model_config.ConfigError(str(error)) from None
    return None if environment is None else (environment.python, environment.env)


def _python_model_file(
    path: str, proto: pb.ModelConfig, versions: list[int], python_based: bool = False
) -> Path | None:
    """The latest version's model.py of a Python model (what auto-complete imports); for a
    model of a Python-based backend (``python_based``), where that file would be (it need
    not exist: the backend's model.py runs, and ``get_model_dir()`` is its directory)."""
    if not versions:
        return None
    filename = proto.default_model_filename or "model.py"
    candidate = Path(path) / str(max(versions)) / filename
    if python_based:
        return candidate
    if proto.platform or (proto.backend and proto.backend != "python"):
        return None
    return candidate if candidate.suffix == ".py" and candidate.is_file() else None
