"""Model versions: the numeric subdirectories of a model directory, and which of them to serve."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError
from .model_config import VersionPolicy

log = logging.getLogger("shoal")

#: Subdirectories of a model directory that are not versions (Triton's skip list, plus Python's
#: byte-code cache): passed over without a word.
_NOT_VERSIONS = frozenset({"warmup", "initial_state", "configs", "__pycache__"})


def list_versions(model_dir: str | Path, *, warn: bool = True) -> list[int]:
    """The versions in ``model_dir``: its subdirectories named by a number, ascending.

    Other entries are ignored, as Triton ignores them: files, hidden directories, and with
    Triton's warning (``warn``) directories named otherwise or by a number with a leading zero
    (``003`` is not version 3: Triton would load none of it).
    """
    versions: set[int] = set()
    for entry in Path(model_dir).iterdir():
        name = entry.name
        if name.startswith(".") or name in _NOT_VERSIONS or not entry.is_dir():
            continue
        if not (name.isascii() and name.isdigit()):
            reason = "fails to convert to integral number"
        elif len(name) > 1 and name[0] == "0":
            reason = "contains leading zeros in its directory name"
        else:
            versions.add(int(name))
            continue
        if warn:
            log.warning("ignore version directory '%s' which %s", name, reason)
    return sorted(versions)


class NoVersionToServe(ConfigError):
    """The version policy selects no version of the model. Triton keeps such a model in its
    table with no version, so requests for it hear that it has no available versions."""


def select_versions(
    policy: VersionPolicy, available: Iterable[int], *, model_name: str | None = None
) -> list[int]:
    """The versions ``policy`` serves out of ``available``, ascending.

    ``("latest", n)`` serves the ``n`` highest, ``("all",)`` all of them, ``("specific", vs)``
    those of ``vs`` that exist (the others logged). Raises :class:`NoVersionToServe` when the
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
        raise NoVersionToServe(
            f"{model} has no version to serve (versions found: {found}): add a numbered version "
            "directory such as 1/ holding the model files"
        )
    return selected


__all__ = ["NoVersionToServe", "list_versions", "select_versions"]


def _specific(wanted: tuple[int, ...], versions: list[int], model: str, found: str) -> list[int]:
    """The versions a specific policy lists that the model directory has. A listed version
    without its directory is logged and the others load, as in Triton (none left: no version
    to serve, raised by the caller)."""
    missing = sorted(set(wanted) - set(versions))
    for version in missing:
        log.error(
            "version %d is specified for %s, but the version directory is not present "
            "(versions found: %s): add the version directory or change version_policy",
            version,
            model,
            found,
        )
    return sorted(set(wanted) & set(versions))
