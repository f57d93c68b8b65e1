"""Loading a model directory's configuration: read, complete with defaults, validate, type.

``load_model_config`` is the whole path. It is two steps so that something can run between
them (a Python model's ``auto_complete_config``, later): :func:`read_config` gives the raw
configuration as written, :func:`complete_config` fills defaults, validates and returns the
typed view. Errors are :class:`ConfigError` naming the file, the line and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.protos import model_config_pb2 as pb

from ._locate import FieldLocations
from .defaults import DEFAULT_MODEL_FILENAMES, fill_defaults
from .errors import ConfigError
from .json_form import json_to_config
from .model_config import ModelConfig, model_config_from_proto
from .parsing import parse_config_text
from .validation import validate_config
from .versions import list_versions

CONFIG_FILENAME = "config.pbtxt"
#: Where ``--model-config-name`` looks for a model's custom configurations.
CUSTOM_CONFIGS = "configs"
_SUFFIX_BACKENDS = {".py": "python", ".onnx": "onnxruntime", ".pt": "pytorch"}


@dataclass(frozen=True)
class ConfigSource:
    """A model's configuration as written, before defaults: from ``config.pbtxt`` (``text``
    holds the file), from an override (``text`` is ``None``), or empty when the model has no
    ``config.pbtxt``. ``proto`` must not be changed; copy it first."""

    model_dir: Path
    proto: pb.ModelConfig
    config_file: Path | None = None
    text: str | None = None


def load_model_config(
    model_dir: str | Path,
    *,
    strict: bool = False,
    gpus: Sequence[int] = (),
    override: Mapping[str, Any] | None = None,
) -> ModelConfig:
    """Read, complete and validate the configuration of the model in ``model_dir``.

    ``strict`` (``--strict-model-config``) requires a ``config.pbtxt``; otherwise a model without
    one gets a minimal configuration (its name, and the backend found from its files, such as
    ``python`` for a ``model.py``). ``gpus`` are the GPU ids the server may use. ``override`` is
    a configuration in Triton's JSON form that replaces ``config.pbtxt`` (a load request's
    ``config`` parameter).
    """
    return complete_config(read_config(model_dir, strict=strict, override=override), gpus=gpus)


def read_config(
    model_dir: str | Path,
    *,
    strict: bool = False,
    override: Mapping[str, Any] | None = None,
    config_name: str = "",
) -> ConfigSource:
    """The configuration of ``model_dir`` as written (see :func:`load_model_config`);
    ``config_name`` (``--model-config-name``) reads ``configs/<config_name>.pbtxt`` instead of
    ``config.pbtxt`` where that file exists, as Triton does."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"model directory {model_dir} does not exist or is not a directory")
    if override is not None:
        return _override_source(model_dir, override)
    config_file = config_path(model_dir, config_name)
    if not config_file.is_file():
        if strict:
            raise ConfigError(
                f"model '{model_dir.name}' has no {CONFIG_FILENAME}, which strict model "
                "configuration (--strict-model-config=true or --disable-auto-complete-config) "
                f"requires: add {config_file}, or start the server without them",
                path=config_file,
            )
        return ConfigSource(model_dir, pb.ModelConfig())
    text = _read_text(config_file)
    return ConfigSource(model_dir, parse_config_text(text, path=config_file), config_file, text)


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """The file a model's configuration is read from: ``configs/<config_name>.pbtxt`` when
    named and present, else ``config.pbtxt``."""
    if config_name:
        custom = model_dir / CUSTOM_CONFIGS / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILENAME


def _override_source(model_dir: Path, override: Mapping[str, Any]) -> ConfigSource:
    try:
        return ConfigSource(model_dir, json_to_config(override))
    except ConfigError as exc:
        raise exc.located(model_dir, None) from None


def complete_config(
    source: ConfigSource, *, gpus: Sequence[int] = (), proto: pb.ModelConfig | None = None
) -> ModelConfig:
    """Fill defaults into a copy of ``proto`` (default: ``source.proto``), validate it and
    return the typed view; errors point into ``source``'s file where they can."""
    config = pb.ModelConfig()
    config.CopyFrom(source.proto if proto is None else proto)
    try:
        detected = _detected_backend(config, source.model_dir)
        fill_defaults(
            config, model_name=source.model_dir.name, gpus=gpus, detected_backend=detected
        )
        warnings = validate_config(config, gpus=gpus)
    except ConfigError as exc:
        raise _locate(exc, source) from None
    return model_config_from_proto(
        config, path=source.model_dir, config_file=source.config_file, warnings=tuple(warnings)
    )


def _detected_backend(config: pb.ModelConfig, model_dir: Path) -> str | None:
    if config.backend or config.platform:
        return None
    return detect_backend(model_dir, config.default_model_filename)


def detect_backend(model_dir: Path, default_model_filename: str = "") -> str | None:
    """The backend of a model that names none, from its model file (``model.py`` -> python)."""
    if default_model_filename:
        return _SUFFIX_BACKENDS.get(Path(default_model_filename).suffix)
    newest_first = reversed(list_versions(model_dir, warn=False))  # the load warns
    found = (_backend_in(model_dir / str(version)) for version in newest_first)
    return next((backend for backend in found if backend is not None), None)


def _backend_in(version_dir: Path) -> str | None:
    """The backend whose default model file is in ``version_dir``."""
    for backend, filename in DEFAULT_MODEL_FILENAMES.items():
        if (version_dir / filename).exists():
            return backend
    return None


def _read_text(config_file: Path) -> str:
    try:
        return config_file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{config_file.name} is not UTF-8 text (byte {exc.start}): save it as UTF-8",
            path=config_file,
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read {config_file.name}: {exc.strerror}", path=config_file
        ) from None


def _locate(error: ConfigError, source: ConfigSource) -> ConfigError:
    if source.text is None or source.config_file is None:
        return error.located(source.config_file or source.model_dir, None)
    descriptor = pb.DESCRIPTOR.message_types_by_name["ModelConfig"]
    line = FieldLocations(source.text, descriptor).line(error.field_path)
    return error.located(source.config_file, line)


__all__ = [
    "CONFIG_FILENAME",
    "ConfigSource",
    "complete_config",
    "config_path",
    "detect_backend",
    "load_model_config",
    "read_config",
]
