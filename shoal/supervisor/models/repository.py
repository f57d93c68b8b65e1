"""Find models in one or more model repositories (directories of model directories), and
fingerprint a model directory (what poll mode compares)."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Names, sizes and modification times of a model directory's files.
Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class ModelSource:
    name: str
    path: str


class DuplicateModel(Exception):
    """The same model name exists in two repositories."""


def scan(repositories: tuple[str, ...]) -> tuple[dict[str, ModelSource], dict[str, str]]:
    """Model directories by name, and the names that cannot load (with the reason)."""
    found: dict[str, ModelSource] = {}
    broken: dict[str, str] = {}
    for repo in repositories:
        if not os.path.isdir(repo):
            raise FileNotFoundError(f"model repository '{repo}' is not a directory")
        for entry in sorted(os.listdir(repo)):
            path = os.path.join(repo, entry)
            if entry.startswith(".") or not os.path.isdir(path):
                continue
            if entry in found:
                broken[entry] = (
                    f"model '{entry}' appears in more than one repository: "
                    f"'{found[entry].path}' and '{path}'"
                )
                continue
            found[entry] = ModelSource(entry, path)
    for name in broken:
        found.pop(name, None)
    return found, broken


def fingerprint(model_dir: str) -> Fingerprint:
    """Names, sizes and modification times of every file of a model directory."""
    entries = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            entries.append((os.path.relpath(path, model_dir), st.st_size, st.st_mtime_ns))
    return tuple(entries)
