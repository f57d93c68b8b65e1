"""What the metadata and statistics calls answer about the loaded models."""

from __future__ import annotations

from collections.abc import Iterable

from shoal.config import TensorConfig
from shoal.core.errors import InvalidArgument, NotFound, ShoalError, Unavailable
from shoal.core.types import ModelMetadata, ModelStatistics, TensorMetadata
from shoal.supervisor.models.manager import ModelRepositoryManager


def metadata(repo: ModelRepositoryManager, name: str, version: str = "") -> ModelMetadata:
    """A loaded model's metadata; NotFound / Unavailable otherwise."""
    mv = repo.resolve(name, version)
    config = mv.config
    batch = (-1,) if config.max_batch_size > 0 else ()
    versions = repo.models[name]
    return ModelMetadata(
        name=name,
        versions=tuple(str(v) for v, m in sorted(versions.items()) if m.ready),
        platform=config.platform or config.backend,
        inputs=_tensors(config.inputs, batch),
        outputs=_tensors(config.outputs, batch),
    )


def _tensors(tensors: Iterable[TensorConfig], batch: tuple[int, ...]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(t.name, t.datatype, batch + tuple(t.dims)) for t in tensors)


def statistics(
    repo: ModelRepositoryManager, name: str = "", version: str = ""
) -> list[ModelStatistics]:
    """Statistics of every ready model, of one model's ready versions, or of one version."""
    if not name:
        return _every_model(repo, version)
    if name not in repo.models:
        raise InvalidArgument(f"requested model '{name}' is not available")
    if version:
        try:
            return [repo.resolve(name, version).stats.snapshot()]
        except (NotFound, Unavailable):  # Triton's answer for a version not ready too
            raise InvalidArgument(
                f"requested model version is not available for model '{name}'"
            ) from None
    versions = repo.models[name].values()
    return [mv.stats.snapshot() for mv in sorted(versions, key=lambda m: m.version) if mv.ready]


def _every_model(repo: ModelRepositoryManager, version: str) -> list[ModelStatistics]:
    if version:
        raise InvalidArgument("a model version was given without a model name")
    return [mv.stats.snapshot() for mv in repo.versions() if mv.ready]


def decoupled(repo: ModelRepositoryManager, name: str, version: str = "") -> bool:
    """Whether the model version a request names is decoupled now (False when there is none:
    the request's error is its one answer)."""
    try:
        return repo.resolve(name, version).config.decoupled
    except ShoalError:
        return False
