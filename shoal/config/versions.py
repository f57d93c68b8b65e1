"""Model versions: the numeric subdirectories of a model directory, and which of them to serve."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError
from .model_config import VersionPolicy


def list_versions(model_dir: str | Path) -> list[int]:
    """The versions in ``model_dir``: its subdirectories named by a number, ascending.

    Other entries (files, hidden or non-numeric directories) are ignored, as Triton ignores them.
    """
    versions: set[int] = set()
    for entry in Path(model_dir).iterdir():
        if entry.name.isascii() and entry.name.isdigit() and entry.is_dir():
            versions.add(int(entry.name))
    return sorted(versions)


def select_versions(
    policy: VersionPolicy, available: Iterable[int], *, model_name: str | None = None
) -> list[int]:
    """The versions ``policy`` serves out of ``available``, ascending.

    ``("latest", n)`` serves the ``n`` highest, ``("all",)`` all of them, ``("specific", vs)``
    exactly ``vs``. Raises :class:`ConfigError` when a specific version does not exist or the
    policy selects nothing.
    """
    versions = sorted(set(available))
    model = f"model '{model_name}'" if model_name else "the model"
    found = ", ".join(map(str, versions)) or "none"
    match policy:
        case ("latest", int(count)):
            selected = versions[-count:] if count > 0 else []
        case ("all",):
            selected = versions
        case ("specific", tuple(wanted)):
            selected = _specific(wanted, versions, model, found)
        case _:
            raise ConfigError(f"unknown version policy {policy!r}")
    if not selected:
        raise ConfigError(
            f"{model} has no version to serve (versions found: {found}): add a numbered version "
            "directory such as 1/ holding the model files"
        )
    return selected


__all__ = ["list_versions", "select_versions"]


def _specific(wanted: tuple[int, ...], versions: list[int], model: str, found: str) -> list[int]:
    """The versions a specific policy lists, when the model directory has every one."""
    missing = sorted(set(wanted) - set(versions))
    if missing:
        names = ", ".join(map(str, missing))
        plural = "s" if len(missing) > 1 else ""
        raise ConfigError(
            f"version_policy of {model} lists version{plural} {names}, which the model "
            f"directory does not have (versions found: {found}): add the version "
            "directory or change version_policy"
        )
    return sorted(set(wanted))
