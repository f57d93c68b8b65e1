"""The loaded model versions, by name and version: what every request resolves against.

The repository manager writes the table (loads, unloads, failures); requests, BLS calls, ensemble
steps and the input arena's new-segment news read it. It exists before any of them, so each is
given the table when it is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shoal.core.errors import ErrorCode, NotFound, ShoalError, Unavailable
from shoal.core.versions import version_number
from shoal.supervisor.models.version import ModelState, ModelVersion


class LoadedModels:
    """Loaded versions by model name, plus the reason of each model that failed to load."""

    def __init__(self) -> None:
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.failed: dict[str, str] = {}
        #: Models unloaded because their directory left the repository (poll mode): Triton keeps
        #: them in its table, so a request says they have no version, not that they are unknown.
        self.removed: set[str] = set()
        #: Failed models whose configuration was read but that have no version to serve: Triton
        #: lists them with no version, so a request says so rather than that they are unknown.
        self.versionless: set[str] = set()

    def versions(self) -> Iterator[ModelVersion]:
        for versions in self.models.values():
            yield from versions.values()

    def fail(self, name: str, reason: str, versionless: bool = False) -> None:
        """``name`` failed to load, for ``reason``."""
        self.failed[name] = reason
        if versionless:
            self.versionless.add(name)
        else:
            self.versionless.discard(name)

    def announce_segment(self, segment: Any) -> None:
        """A new input-arena segment: every live stub must be able to map it."""
        for mv in self.versions():
            for instance in mv.instances:
                instance.announce_segment(segment)

    def resolve(self, name: str, version: str) -> ModelVersion:
        """The version a request for ``name`` (``version`` "" = the policy's latest) goes to."""
        versions = self.models.get(name)
        if versions is None:
            if version:
                version_number(version)  # Triton reads the version before it looks for the model
            raise self._unknown(name)
        if version:
            return _exact(name, version, versions)
        if len(versions) == 1:  # the common case, on every request: no list, no max()
            (mv,) = versions.values()
            if mv.state is ModelState.READY:  # mv.ready, without its (interpreted) call
                return mv
        return _latest_ready(name, versions)

    def _unknown(self, name: str) -> ShoalError:
        if name in self.failed and name in self.versionless:
            return NotFound(  # Triton's code and words, then why
                f"Request for unknown model: '{name}' has no available versions: "
                f"{self.failed[name]}"
            )
        if name in self.failed:
            return Unavailable(
                f"Request for unknown model: '{name}' is not found: {self.failed[name]}",
                ErrorCode.UNAVAILABLE,
            )
        if name in self.removed:
            return NotFound(f"Request for unknown model: '{name}' has no available versions")
        return NotFound(f"Request for unknown model: '{name}' is not found")


def _exact(name: str, version: str, versions: dict[int, ModelVersion]) -> ModelVersion:
    """Version ``version`` of ``name``, when it is ready."""
    mv = versions.get(version_number(version))
    if mv is None:
        raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
    if not mv.ready:
        detail = f": {mv.reason}" if mv.reason else ""
        raise Unavailable(  # Triton's words (clients match them), then why
            f"Request for unknown model: '{name}' version {version} is not at ready state{detail}"
        )
    return mv


def _latest_ready(name: str, versions: dict[int, ModelVersion]) -> ModelVersion:
    ready = [mv for mv in versions.values() if mv.ready]
    if ready:
        return max(ready, key=lambda mv: mv.version)
    raise _none_ready(name, versions)


def _none_ready(name: str, versions: dict[int, ModelVersion]) -> ShoalError:
    reasons = "; ".join(mv.reason for mv in versions.values() if mv.reason)
    text = f"Request for unknown model: '{name}' has no available versions" + (
        f": {reasons}" if reasons else ""
    )
    if all(mv.reason == "unloaded" for mv in versions.values()):
        return NotFound(text)  # Triton's code for an unloaded model
    return Unavailable(text)
