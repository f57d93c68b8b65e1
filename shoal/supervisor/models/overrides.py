"""A load's ``config`` override outlives the load, as in Triton.

Triton stamps the model's configuration with the time of a load that overrides it; a later load
without an override finds nothing in the model directory newer than that stamp, counts the model
unchanged and keeps it, override included. Touching ``config.pbtxt`` (or any file of the model)
after the override makes the next plain load read the directory again. An unload, or a load with
model files, forgets the override.
"""

from __future__ import annotations

import os
import time


class KeptOverrides:
    """The override each loaded model last loaded with, and when."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[str, int]] = {}
        # What the load in progress of each model would keep once it serves (None: nothing).
        self._pending: dict[str, tuple[str, int] | None] = {}

    def resolve(
        self, name: str, model_dir: str, config_json: str | None, with_files: bool
    ) -> str | None:
        """The override a load of ``name`` from ``model_dir`` uses: its own, else the kept one
        while no file of the model changed since it was given."""
        kept = self._kept.get(name)
        if config_json is not None:
            self._pending[name] = None if with_files else (config_json, time.time_ns())
            return config_json
        if kept is not None and not with_files and newest_change_ns(model_dir) <= kept[1]:
            self._pending[name] = kept
            return kept[0]
        self._pending[name] = None
        return None

    def served(self, name: str) -> None:
        """The load of ``name`` succeeded: keep what it loaded with."""
        kept = self._pending.pop(name, None)
        if kept is None:
            self._kept.pop(name, None)
        else:
            self._kept[name] = kept

    def forget(self, name: str) -> None:
        self._kept.pop(name, None)
        self._pending.pop(name, None)


def newest_change_ns(model_dir: str) -> int:
    """The latest modification time (ns) of ``model_dir`` and anything in it; bytecode caches
    the stubs write on import do not count."""
    newest = 0
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in (root, *(os.path.join(root, f) for f in files)):
            try:
                newest = max(newest, os.stat(name).st_mtime_ns)
            except OSError:
                continue
    return newest


__all__ = ["KeptOverrides", "newest_change_ns"]
