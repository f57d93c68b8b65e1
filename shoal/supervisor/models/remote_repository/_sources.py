"""The ``--model-repository`` locations as local directories the repository manager can scan."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from shoal.supervisor.models.remote_repository._errors import RemoteRepositoryError
from shoal.supervisor.models.remote_repository._filesystem import open_filesystem
from shoal.supervisor.models.remote_repository._listing import Changes
from shoal.supervisor.models.remote_repository._location import is_remote, parse_location
from shoal.supervisor.models.remote_repository._mirror import RemoteRepository

log = logging.getLogger("shoal")


class RepositorySources:
    """Local repositories are used where they are; remote ones are mirrored under a cache
    directory: ``cache_dir`` if given (kept, and reused after a restart), else a temporary
    directory removed by :meth:`close`.

    :meth:`open` downloads every remote repository (raising :class:`RemoteRepositoryError`, fatal
    at start-up); :meth:`sync` brings them, or one model of them, up to date. Both leave the
    event loop free: the downloads run in a worker thread.
    """

    def __init__(
        self,
        locations: Sequence[str],
        cache_dir: str = "",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._locations = tuple(locations)
        self._cache_dir = cache_dir
        self._environ = os.environ if environ is None else environ
        self._mirrors: list[RemoteRepository] = []
        self._temporary: str | None = None
        #: What to scan, in ``--model-repository`` order; remote entries are set by :meth:`open`.
        self.local_paths: tuple[str, ...] = tuple(p for p in locations if not is_remote(p))

    async def open(self) -> None:
        if any(is_remote(p) for p in self._locations):
            await asyncio.to_thread(self._open)

    async def sync(self, model: str | None = None) -> Changes:
        """Bring the mirrors up to date (only ``model``'s prefix if given); what changed."""
        if not self._mirrors:
            return Changes()
        return await asyncio.to_thread(self._sync, model)

    def close(self) -> None:
        for mirror in self._mirrors:
            mirror.close()
        self._mirrors.clear()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None

    def _cache_root(self) -> Path:
        if self._cache_dir:
            return Path(self._cache_dir)
        self._temporary = tempfile.mkdtemp(prefix="shoal-repositories-")
        return Path(self._temporary)

    def _open(self) -> None:
        root = self._cache_root()
        paths = []
        for text in self._locations:
            if not is_remote(text):
                paths.append(text)
                continue
            location = parse_location(text)
            filesystem = open_filesystem(location, self._environ)
            mirror = RemoteRepository(location, root / _directory_name(text), filesystem)
            self._mirrors.append(mirror)
            mirror.sync()
            if not mirror.models:
                raise RemoteRepositoryError(
                    f"model repository '{text}' has no model directories: nothing is stored "
                    f"under '{location.root}/'"
                )
            log.info(
                "model repository '%s': %d models in '%s'",
                text,
                len(mirror.models),
                mirror.local_dir,
            )
            paths.append(str(mirror.local_dir))
        self.local_paths = tuple(paths)

    def _sync(self, model: str | None) -> Changes:
        changed: set[str] = set()
        removed: set[str] = set()
        for mirror in self._mirrors:
            changes = mirror.sync(model)
            changed.update(changes.changed)
            removed.update(changes.removed)
        return Changes(tuple(sorted(changed)), tuple(sorted(removed - changed)))


def _directory_name(url: str) -> str:
    """A readable, collision-free directory name for ``url`` inside the cache."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url).strip("._")[:80]
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return f"{readable}-{digest}"
