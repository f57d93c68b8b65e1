"""Keep a local directory a copy of one remote model repository.

Layout of the local directory (the model repository the manager scans)::

    <model>/...              one directory per model, as in the bucket
    .shoal-manifest.json     the fingerprint each model was downloaded at (a persistent cache
                             downloads nothing again after a restart unless it changed)
    .shoal-lock              held while a server uses the directory
    .incoming-*/  .old-*/    a download in progress, a replaced copy being removed

Entries starting with '.' are not models to the scanner, so a half-downloaded model is never seen:
each model is downloaded into ``.incoming-*`` and renamed into place once complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from shoal.supervisor.models.remote_repository._errors import RemoteRepositoryError
from shoal.supervisor.models.remote_repository._listing import (
    Changes,
    Fingerprint,
    RemoteFile,
    compare,
    fingerprint,
    group_by_model,
)
from shoal.supervisor.models.remote_repository._location import RemoteLocation

log = logging.getLogger("shoal")

MANIFEST = ".shoal-manifest.json"
LOCK = ".shoal-lock"
_SCRATCH_PREFIXES = (".incoming-", ".old-")


class RemoteRepository:
    """``local_dir`` mirrors the models under ``location``; :meth:`sync` brings it up to date.

    Blocking (it calls the back-end's synchronous API): run it in a worker thread. Calls are
    serialised, so a poll and an explicit load never download into the same directory at once.
    """

    def __init__(self, location: RemoteLocation, local_dir: Path, filesystem: Any) -> None:
        self.location = location
        self.local_dir = local_dir
        self._fs = filesystem
        self._mutex = threading.Lock()
        local_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(local_dir, location.url)
        self._remove_scratch()
        self._known = self._read_manifest()

    @property
    def models(self) -> tuple[str, ...]:
        """The models of the last listing, as they are on disk now."""
        return tuple(sorted(self._known))

    def sync(self, model: str | None = None) -> Changes:
        """Download added and changed models, remove deleted ones; ``model`` limits the listing
        (and the work) to that model's prefix."""
        if model is not None and (not model or "/" in model or model.startswith(".")):
            return Changes()  # not a model name a listing could give: nothing to fetch
        with self._mutex:
            listed = self._list(model)
            changes = self._compare(listed, model)
            for name in changes.changed:
                self._download(name, listed[name])
            for name in changes.removed:
                self._remove(name)
            if changes.changed or changes.removed:
                self._write_manifest()
            return changes

    def close(self) -> None:
        os.close(self._lock_fd)

    # -- listing and downloading ------------------------------------------------------------

    def _compare(self, listed: dict[str, list[RemoteFile]], model: str | None) -> Changes:
        fingerprints = {name: fingerprint(files) for name, files in listed.items()}
        return compare(self._known, fingerprints, None if model is None else (model,))

    def _list(self, model: str | None) -> dict[str, list[RemoteFile]]:
        root = self.location.root
        path = root if model is None else f"{root}/{model}"
        try:
            # Listings are cached by the back-end; a poll must see the store as it is now.
            self._fs.invalidate_cache()
            listing = self._fs.find(path, detail=True)
        except Exception as error:  # each back-end raises its own types (botocore, aiohttp, ...)
            raise RemoteRepositoryError(
                f"model repository '{self.location.url}' cannot be listed: {_describe(error)}"
            ) from error
        return group_by_model(root, listing)

    def _download(self, name: str, files: list[RemoteFile]) -> None:
        incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.local_dir))
        try:
            staged = incoming / name
            staged.mkdir()
            self._fetch(staged, files)
            self._replace(name, staged)
        except Exception as error:
            raise RemoteRepositoryError(
                f"model '{name}' of repository '{self.location.url}' could not be downloaded: "
                f"{_describe(error)}"
            ) from error
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        self._known[name] = fingerprint(files)
        log.info("model repository '%s': downloaded '%s'", self.location.url, name)

    def _fetch(self, staged: Path, files: list[RemoteFile]) -> None:
        objects = self._layout(staged, files)
        if objects:
            self._fs.get([f.key for f in objects], [str(staged / f.path) for f in objects])
        for f in objects:
            _check_size(staged / f.path, f)

    @staticmethod
    def _layout(staged: Path, files: list[RemoteFile]) -> list[RemoteFile]:
        """Make the directories of ``files`` under ``staged``; the objects to download."""
        objects = []
        for f in files:
            if f.path.endswith("/"):  # an empty "folder" object
                (staged / f.path).mkdir(parents=True, exist_ok=True)
            else:
                (staged / f.path).parent.mkdir(parents=True, exist_ok=True)
                objects.append(f)
        return objects

    def _replace(self, name: str, staged: Path) -> None:
        """Put ``staged`` where the scanner finds model ``name``, replacing the old copy."""
        final = self.local_dir / name
        if not final.exists():
            staged.rename(final)
            return
        old = Path(tempfile.mkdtemp(prefix=".old-", dir=self.local_dir))
        final.rename(old / name)
        staged.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def _remove(self, name: str) -> None:
        old = Path(tempfile.mkdtemp(prefix=".old-", dir=self.local_dir))
        with contextlib.suppress(FileNotFoundError):
            (self.local_dir / name).rename(old / name)
        shutil.rmtree(old, ignore_errors=True)
        self._known.pop(name, None)
        log.info("model repository '%s': '%s' was removed", self.location.url, name)

    # -- the manifest and the directory -----------------------------------------------------

    def _saved_models(self) -> dict[str, Any]:
        """The manifest's models, when it is this repository's."""
        try:
            saved = json.loads((self.local_dir / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}
        return saved.get("models", {}) if saved.get("url") == self.location.url else {}

    def _read_manifest(self) -> dict[str, Fingerprint]:
        """Fingerprints of the copies on disk; a copy the manifest does not vouch for (a crash
        between rename and manifest write) gets an empty one, so it is downloaded again."""
        on_disk = {
            e.name for e in self.local_dir.iterdir() if e.is_dir() and not e.name.startswith(".")
        }
        models = self._saved_models()
        return {
            name: tuple((str(p), int(s), str(t)) for p, s, t in models.get(name, ()))
            for name in on_disk
        }

    def _write_manifest(self) -> None:
        manifest = {"url": self.location.url, "models": self._known}
        partial = self.local_dir / f"{MANIFEST}.partial"
        partial.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        partial.replace(self.local_dir / MANIFEST)

    def _remove_scratch(self) -> None:
        """What a killed server left half done."""
        for entry in self.local_dir.iterdir():
            if entry.name.startswith(_SCRATCH_PREFIXES):
                shutil.rmtree(entry, ignore_errors=True)


def _check_size(path: Path, f: RemoteFile) -> None:
    got = path.stat().st_size
    if got != f.size:
        raise OSError(f"'{f.key}' has {got} bytes, the listing said {f.size}")


def _lock(directory: Path, url: str) -> int:
    """Lock ``directory`` for this process (released when the fd closes or the process dies)."""
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RemoteRepositoryError(
            f"model repository '{url}': the cache directory '{directory}' is in use by another "
            "shoal process; give each server its own --model-repository-cache"
        ) from None
    return fd


def _describe(error: BaseException) -> str:
    """The back-end's message with its type (PermissionError, FileNotFoundError, ...)."""
    return f"{type(error).__name__}: {error}"
