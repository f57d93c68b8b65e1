"""The repository index: every model of the repositories, loaded or not, with its state."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from shoal.core.types import RepositoryEntry
from shoal.supervisor.models.version import ModelState, ModelVersion


def repository_index(
    names: Iterable[str],
    models: dict[str, dict[int, ModelVersion]],
    failed: dict[str, str],
    ready_only: bool,
) -> list[RepositoryEntry]:
    """One entry per version of each loaded model, one per model otherwise (its failure, or
    nothing when it was never loaded), sorted by name; ``ready_only``: serving versions only."""
    entries: list[RepositoryEntry] = []
    for name in sorted(set(names) | set(models) | set(failed)):
        versions = models.get(name)
        if versions:
            entries.extend(_version_entries(name, versions, ready_only))
        elif not ready_only:
            entries.append(_unloaded_entry(name, failed))
    return entries


def _unloaded_entry(name: str, failed: dict[str, str]) -> RepositoryEntry:
    """A model with no version loaded: its failure, or nothing when it was never loaded."""
    reason = failed.get(name)
    return RepositoryEntry(name) if reason is None else _failed_entry(name, reason)


def _version_entries(
    name: str, versions: dict[int, ModelVersion], ready_only: bool
) -> Iterator[RepositoryEntry]:
    for v, mv in sorted(versions.items()):
        if not ready_only or mv.serving:
            yield _version_entry(name, v, mv)


def _version_entry(name: str, version: int, mv: ModelVersion) -> RepositoryEntry:
    if mv.ready and not mv.serving:  # between a stub's death and its restart
        reason = mv.down or "no live instance: a stub died and restarts"
        return RepositoryEntry(name, str(version), ModelState.UNAVAILABLE.value, reason)
    return RepositoryEntry(name, str(version), mv.state.value, mv.reason)


def _failed_entry(name: str, reason: str) -> RepositoryEntry:
    return RepositoryEntry(name, "", "UNAVAILABLE", reason)
