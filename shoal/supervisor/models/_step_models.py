"""An ensemble checked against its step models, as the repository manager knows them: loaded
(their configuration as it serves) or only in a repository (as its ``config.pbtxt`` says)."""

from __future__ import annotations

import dataclasses

from shoal import config as model_config
from shoal.supervisor.models._ensemble_checks import (
    EnsembleProblem,
    check_ensemble,
    decoupled_flow,
)
from shoal.supervisor.models.repository import ModelSource
from shoal.supervisor.models.version import ModelVersion

_Loaded = dict[str, dict[int, ModelVersion]]


def ensemble_problem(
    config: model_config.ModelConfig,
    sources: dict[str, ModelSource],
    models: _Loaded,
    config_name: str = "",
) -> str | None:
    """What stops an ensemble from loading, checked against its step models (nested
    ensembles included) as Triton does; step models still loading at start-up are skipped.
    ``config_name``: ``--model-config-name``, for the steps read from a repository."""
    try:
        check_ensemble(
            config,
            lambda name: name in sources or name in models,
            lambda name: _loaded_config(name, models),
            lambda name: _steps_of(name, sources, models, config_name),
        )
        decoupled_flow(config, lambda name: _decoupled(name, sources, models, config_name, ()))
    except EnsembleProblem as problem:
        return str(problem)
    return None


def settle_ensemble(
    mv: ModelVersion, sources: dict[str, ModelSource], models: _Loaded, config_name: str = ""
) -> str | None:
    """What stops ensemble version ``mv`` from loading (:func:`ensemble_problem`); when
    nothing does, its transaction policy is set as Triton sets it: decoupled when one of its
    steps is, whatever its configuration says (served so, and streamed so)."""
    problem = ensemble_problem(mv.config, sources, models, config_name)
    if problem is None:
        decoupled = ensemble_decoupled(mv.config, sources, models, config_name)
        if decoupled != mv.config.decoupled:
            mv.config = dataclasses.replace(mv.config, decoupled=decoupled)
            mv.plain = not (mv.is_ensemble or decoupled)
        mv.config_json["model_transaction_policy"] = {"decoupled": decoupled}
    return problem


def ensemble_decoupled(
    config: model_config.ModelConfig,
    sources: dict[str, ModelSource],
    models: _Loaded,
    config_name: str = "",
) -> bool:
    """Whether the ensemble is decoupled (one of its steps is: Triton's rule), once
    :func:`ensemble_problem` found nothing wrong with it."""
    try:
        return decoupled_flow(
            config, lambda name: _decoupled(name, sources, models, config_name, ())
        )
    except EnsembleProblem:
        return False


def _decoupled(
    name: str,
    sources: dict[str, ModelSource],
    models: _Loaded,
    config_name: str,
    seen: tuple[str, ...],
) -> bool:
    """Whether step model ``name`` is decoupled: as it serves when loaded, else as its
    repository config says (a step still loading at start-up); a nested ensemble is when one
    of its steps is."""
    loaded = _loaded_config(name, models)
    if loaded is not None:
        return loaded.decoupled
    source = sources.get(name)
    if source is None or name in seen:
        return False
    try:
        proto = model_config.read_config(source.path, config_name=config_name).proto
    except (model_config.ConfigError, OSError):
        return False  # it fails its own load, with its own message
    if proto.platform != "ensemble":
        return proto.model_transaction_policy.decoupled
    return any(
        _decoupled(s.model_name, sources, models, config_name, (*seen, name))
        for s in proto.ensemble_scheduling.step
    )


def _loaded_config(name: str, models: _Loaded) -> model_config.ModelConfig | None:
    versions = models.get(name)
    if not versions:
        return None
    return max(versions.values(), key=lambda v: v.version).config


def _steps_of(
    name: str, sources: dict[str, ModelSource], models: _Loaded, config_name: str
) -> list[str]:
    """The step models of ensemble ``name``: loaded, else as its repository config says."""
    loaded = _loaded_config(name, models)
    if loaded is not None:
        return [s.model_name for s in loaded.ensemble_steps]
    source = sources.get(name)
    return [] if source is None else _configured_steps(source, config_name)


def _configured_steps(source: ModelSource, config_name: str) -> list[str]:
    """The step models an ensemble's config in its repository names."""
    try:
        proto = model_config.read_config(source.path, config_name=config_name).proto
    except (model_config.ConfigError, OSError):
        return []  # it fails its own load, with its own message
    return [s.model_name for s in proto.ensemble_scheduling.step]
