"""Change detection from one listing of a remote repository: no object is read to find a change.

A model's fingerprint is the set of its objects' (path, size, version token); the token is the
object's ETag where the store gives one, else its modification time. A model whose fingerprint
differs from the one last downloaded is downloaded again; one that is no longer listed is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shoal")

#: Keys of an fsspec ``find(detail=True)`` entry that identify an object's content, best first
#: (S3: ETag; GCS: etag, md5Hash; Azure: etag), then its modification time.
_TOKEN_KEYS = ("ETag", "etag", "md5Hash", "LastModified", "last_modified", "updated", "mtime")

#: (path inside the model directory, size in bytes, version token), sorted by path.
Fingerprint = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class RemoteFile:
    """One object of a model: ``key`` as the back-end names it, ``path`` inside the model
    directory (a trailing '/' marks an empty "folder" object)."""

    key: str
    model: str
    path: str
    size: int
    token: str


@dataclass(frozen=True)
class Changes:
    """Models to download again (added or changed) and models to remove, each sorted."""

    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def _token(info: Mapping[str, Any]) -> str:
    for key in _TOKEN_KEYS:
        value = info.get(key)
        if value:
            return str(value)
    return ""


def _safe(parts: list[str]) -> bool:
    """No part that would leave the cache directory, or collide with shoal's hidden entries."""
    return not parts[0].startswith(".") and all(p not in ("", ".", "..") for p in parts[:-1])


def group_by_model(
    root: str, listing: Mapping[str, Mapping[str, Any]]
) -> dict[str, list[RemoteFile]]:
    """The objects under ``root`` by model (the first path part below ``root``).

    Objects directly under ``root`` are not in any model and are ignored, as a local repository's
    plain files are; so are keys with '.' or '..' parts, which could escape the cache."""
    models: dict[str, list[RemoteFile]] = {}
    base = root.rstrip("/") + "/"
    for key, info in listing.items():
        if not key.startswith(base):
            continue
        parts = key[len(base) :].split("/")
        if len(parts) < 2 or not parts[0]:
            continue
        if not _safe(parts) or parts[-1] in (".", ".."):
            log.warning("ignoring object '%s' of the model repository: unsafe path", key)
            continue
        size = int(info.get("size") or 0)
        file = RemoteFile(key, parts[0], _path_in_model(parts), size, _token(info))
        models.setdefault(parts[0], []).append(file)
    return models


def _path_in_model(parts: list[str]) -> str:
    path = "/".join(parts[1:])
    return path or "/"  # the model's own "folder" object: it exists, with nothing in it yet


def fingerprint(files: Iterable[RemoteFile]) -> Fingerprint:
    return tuple(sorted((f.path, f.size, f.token) for f in files))


def compare(
    known: Mapping[str, Fingerprint],
    listed: Mapping[str, Fingerprint],
    scope: Collection[str] | None = None,
) -> Changes:
    """What to download and remove so that the ``known`` copies match the ``listed`` objects.

    ``scope`` limits both to some models (a listing of one model's prefix says nothing about the
    others); None means the listing covers the whole repository."""
    names = set(known) | set(listed) if scope is None else set(scope)
    changed = sorted(n for n in names if n in listed and listed[n] != known.get(n))
    removed = sorted(n for n in names if n in known and n not in listed)
    return Changes(tuple(changed), tuple(removed))
